"""The cost of turns: the rollout driver with K = 3 attempts against single-turn generation.

One process, one SmolLM2 engine (``--engine hf`` or ``fast``, CPU), the arithmetic tasks of the quickstart (level 1),
``--tasks`` tasks x ``--group`` episodes per driver call (the collector's ``tasks_per_batch`` x
``group_size``), sampling as in the quickstart (temperature 1, 48 new tokens), the ``math``
reward. No database: this measures generation and the driver's bookkeeping only.

Four arms, alternating round by round (``a, b, c, d, a, ...``) so machine drift hits all:

a. **single**: ``environment: single`` (today's one-turn answer), one engine call per batch;
b. **multi**: ``multi_attempt`` with K = 3 and the engine's defaults: each row's KV cache kept
   between turns (turn k + 1 prefills only the environment's tokens) and prefixes shared between
   new prompts prefilled once;
c. **multi_no_kv**: the same episodes, prefix sharing only (``keep_kv_tokens = 0``: each turn
   prefills its whole conversation, a prefix shared by several rows once);
d. **multi_no_reuse**: neither (every turn re-prefills every conversation in full).

With ``--engine fast`` (the paged engine, issue 61) arm d is left out: its blocks are always
shared by content, and ``keep_kv_tokens = 0`` (arm c) keeps no conversation, so turn k + 1 finds
only the full blocks of its conversation still cached.

Each arm runs the same task batches with the same seeds. Reported per arm: sampled tokens,
seconds, sampled tokens/s (the throughput to compare: "the same number of tokens" costs
tokens / (tokens/s)), engine calls, mean attempts per episode, environment tokens, and the
prefix reuse: prompt tokens the rows asked for against those the engine prefilled.

    REFLEXDB_MODEL_CACHE=/tmp/reflexdb-models python benchmarks/episodes_bench.py --rounds 3 --json-out /tmp/episodes.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=2, help="driver calls per arm and round")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--attempts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", choices=("hf", "fast"), default="hf")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from reflexdb.collector.engines import SamplingParams, make_engine
    from reflexdb.collector.environments import EnvTask, parse_options
    from reflexdb.collector.episodes import Rollout, environment_factory
    from reflexdb.models import resolve_model
    from reflexdb.collector.rewards import get_reward
    from reflexdb.collector.tasks.arithmetic import arithmetic_tasks

    engine = make_engine(args.engine, model=resolve_model("smollm2"), device="cpu")
    reward = get_reward("math")
    tasks = [EnvTask(i, t.prompt, t.ground_truth) for i, t in
             enumerate(arithmetic_tasks(args.tasks * args.batches * args.rounds, level=1, split="train", seed=0))]
    multi = ("multi_attempt", {"max_attempts": args.attempts})
    arms = {  # environment, its options, share_prefixes, keep_kv_tokens
        "single": ("single", {}, True, 65536),
        "multi": (*multi, True, 65536),
        "multi_no_kv": (*multi, True, 0),
        "multi_no_reuse": (*multi, False, 0),
    }
    if args.engine == "fast":
        del arms["multi_no_reuse"]
    totals = {name: dict(tokens=0, seconds=0.0, calls=0, episodes=0, turns=0, env_tokens=0, prompt_tokens=0,
                         prefilled=0, correct=0) for name in arms}
    for rnd in range(args.rounds):
        for name, (env_name, options, share, kept) in arms.items():
            engine.share_prefixes, engine.keep_kv_tokens = share, kept
            if hasattr(engine, "clear_prefix_cache"):  # fast: blocks cached by an earlier arm's same tasks
                engine.clear_prefix_cache()
            make_env = environment_factory(env_name, parse_options(env_name, options), reward, "plain")
            for b in range(args.batches):
                start = (rnd * args.batches + b) * args.tasks
                batch = tasks[start : start + args.tasks]
                seeds = iter(range(1000 * (start + 1), 1000 * (start + 2)))

                def params(seeds=seeds):
                    return SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=next(seeds))

                r = Rollout(engine, make_env, params, 0)
                p0, f0 = engine.prompt_tokens, engine.prefill_tokens
                t0 = time.perf_counter()
                out = r.run(batch, args.group)
                dt = time.perf_counter() - t0
                tot = totals[name]
                tot["tokens"] += r.stats.sampled_tokens
                tot["seconds"] += dt
                tot["calls"] += r.stats.engine_calls
                tot["episodes"] += r.stats.episodes
                tot["turns"] += r.stats.turns
                tot["env_tokens"] += r.stats.environment_tokens
                tot["prompt_tokens"] += engine.prompt_tokens - p0
                tot["prefilled"] += engine.prefill_tokens - f0
                tot["correct"] += sum(bool(t.correct) for row in out for t in row)
            print(f"round {rnd} {name}: {totals[name]['tokens']} tokens in {totals[name]['seconds']:.1f} s so far",
                  flush=True)
    rows = {}
    for name, t in totals.items():
        rows[name] = {**t, "tokens_per_s": t["tokens"] / t["seconds"], "attempts_per_episode": t["turns"] / t["episodes"],
                      "solved": t["correct"] / t["episodes"], "prefill_saved": 1 - t["prefilled"] / t["prompt_tokens"]}
    single = rows["single"]["tokens_per_s"]
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {args.threads}",
        "load_before": os.getloadavg()[0], "args": vars(args), "arms": rows,
        "ratios": {name: rows[name]["tokens_per_s"] / single for name in rows},
        "engine": args.engine,
        "reuse_speedup": (rows["multi"]["tokens_per_s"] / rows["multi_no_reuse"]["tokens_per_s"]
                          if "multi_no_reuse" in rows else None),
    }
    print(f"{'arm':<18}{'tokens':>8}{'s':>8}{'tok/s':>8}{'calls':>7}{'att/ep':>8}{'solved':>8}{'env tok':>9}"
          f"{'prompt tok':>11}{'prefilled':>10}{'saved':>7}")
    for name, r in rows.items():
        print(f"{name:<18}{r['tokens']:>8}{r['seconds']:>8.1f}{r['tokens_per_s']:>8.1f}{r['calls']:>7}"
              f"{r['attempts_per_episode']:>8.2f}{r['solved']:>8.3f}{r['env_tokens']:>9}{r['prompt_tokens']:>11}"
              f"{r['prefilled']:>10}{r['prefill_saved']:>7.1%}")
    print("tokens/s relative to single:", {k: round(v, 3) for k, v in result["ratios"].items()},
          f"reuse speedup (multi / multi_no_reuse) {result['reuse_speedup']}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
