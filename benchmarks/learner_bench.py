"""Learner step time on CPU: SmolLM2-135M, a batch of 16 groups × 8 trajectories.

What is timed is the real :class:`reflexdb.trainer.learner.Learner` (DeepSpeed ZeRO-0 on CPU,
gloo, fp32, torch AdamW) reading real groups from a real PostgreSQL store::

    Learner(parse_config({... model: smollm2, learner: {groups_per_step, micro_batch_size, lr,
                                                          pi_old}}), store).setup()
    learner.step(group_ids)      # warm-up step, then the timed steps
    learner.publish()            # checkpoint export, timed

Every configuration runs in a fresh child process (so that peak RSS is its own, and DeepSpeed is
initialised once per process), with ``OMP_NUM_THREADS`` / ``torch.set_num_threads`` = ``--threads``
(default 2). The parent starts a fresh embedded PostgreSQL in a temp dir and migrates it (or uses
``--url``: it creates and drops its own database there; the role needs CREATEDB). Each child gets
its own ``REFLEXDB_HOME`` (checkpoints, MLflow sqlite) in the temp dir, removed after it.

Data (written by the child before its learner starts; not timed): groups of ``--group-size``
trajectories for arithmetic tasks (``What is 37 + 8?``), prompts rendered with SmolLM2's chat
template (``plain`` template: 38–40 tokens), responses = SmolLM2 token ids of plausible worked
answers (``To add 37 and 8, ...``), each cut to a length drawn uniformly from [T/2, 3T/2] (mean T,
``--lengths``) and ended with ``<|im_end|>``. The number of correct answers per group is
Binomial(G, p) with p ~ U(0.1, 0.9) per group (so ~11 % of groups are all-wrong or all-right and
carry no gradient, the rest are mixed);
reward = 1.0 if correct else 0.0. Behaviour log-probs are synthetic (−Exp(mean 0.7)): they only
matter for ``pi_old: behaviour``, where they change the loss's values but not its cost.

Breakdown: the learner's collaborators are wrapped (on the instance, or the names the learner
module imported) with timers that record wall and process CPU seconds per call:

    read_groups  Store.read_groups (SQL + payload decode)       pack     batch.pack (padding)
    pi_old fwd   engine.token_logprobs(grad=False)               train fwd  token_logprobs(grad=True)
    loss         the loss function                               backward   engine.backward
    micro step   engine.step at a non-boundary micro-batch       optimizer  engine.step at the boundary
    record       Store.record_step                               mlflow     Tracker.log_metrics
    other        the rest of step() (advantages, metrics, Python)

``perf/batch_seconds`` and ``perf/step_seconds`` are the learner's own metrics (step_seconds stops
before record/mlflow). The loss wrapper also records max |log π_θ − π_old| over loss tokens.
Since 2026-11-24 ``pi_old: recompute`` takes π_old from the training forward itself (detached),
so the ``pi_old fwd`` phase is empty and that difference is 0; the tables in docs/benchmarks.md
before that date show the second forward it used to cost.

Quick run (one configuration, 1 group × 8, one timed step; about a minute)::

    REFLEXDB_MODEL_CACHE=/tmp/reflexdb-models python benchmarks/learner_bench.py --quick

Full run (the numbers in docs/benchmarks-learner.md)::

    REFLEXDB_MODEL_CACHE=/tmp/reflexdb-models python benchmarks/learner_bench.py --json-out /tmp/learner.json

The full matrix: for each response length in ``--lengths`` one configuration at the issue's batch
(``--groups`` 16 × 8, micro-batch 8, π_old recompute, then ``publish()`` timed); for the first
length also ``pi_old: behaviour`` at the same batch, and micro-batch sizes ``--sweep-micro`` with
recompute at ``--sweep-groups`` groups (a smaller batch, to keep the run short: the comparison is
per row). Each configuration: one warm-up step on ``--warmup-groups`` groups, then ``--steps``
timed steps on fresh groups. ``--only`` picks configurations by name. ``--report JSON`` re-renders the
tables of a results file.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from machine import host_facts

RESULT_MARK = "LEARNER_BENCH_RESULT "


def log(msg: str) -> None:
    print(f"[learner-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def du_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20


# ---------------------------------------------------------------------------------------------- data


def make_group_data(tokenizer, n_groups: int, G: int, T: int, seed: int):
    """Pre-generate ``n_groups`` groups of ``G`` (prompt ids, response ids, reward, correct, text)."""
    import numpy as np

    from reflexdb.collector.engines.base import encode_prompt
    from reflexdb.collector.sources import prompt_messages

    rng = np.random.default_rng(seed)
    eos = tokenizer.eos_token_id
    groups = []
    for g in range(n_groups):
        a, b = int(rng.integers(10, 100)), int(rng.integers(2, 100))
        question = f"What is {a} + {b}?"
        prompt_ids = np.asarray(encode_prompt(tokenizer, prompt_messages("plain", question)), dtype=np.int64)
        p_correct = float(rng.uniform(0.1, 0.9))
        trajs = []
        for j in range(G):
            correct = bool(rng.random() < p_correct)
            answer = a + b if correct else a + b + int(rng.choice([-10, -2, -1, 1, 2, 10]))
            length = int(rng.integers(max(2, T // 2), T + T // 2 + 1))
            text = _answer_text(rng, a, b, answer, length)
            ids = tokenizer.encode(text, add_special_tokens=False)
            while len(ids) < length - 1:  # long settings: keep "checking" until long enough
                text += " " + _answer_text(rng, a, b, answer, length, check=True)
                ids = tokenizer.encode(text, add_special_tokens=False)
            response = np.asarray(ids[: length - 1] + [eos], dtype=np.int64)
            trajs.append((prompt_ids, response, 1.0 if correct else 0.0, correct, question,
                          tokenizer.decode(response[:-1])))
        groups.append((question, str(a + b), trajs))
    return groups


def _answer_text(rng, a: int, b: int, answer: int, length: int, check: bool = False) -> str:
    ta, tb, oa, ob = a // 10 * 10, b // 10 * 10, a % 10, b % 10
    steps = [
        f"To add {a} and {b}, I split both numbers into tens and ones.",
        f"The tens are {ta} and {tb}, which make {ta + tb}.",
        f"The ones are {oa} and {ob}, which make {oa + ob}.",
        f"Now {ta + tb} + {oa + ob} = {answer}.",
    ]
    if check:
        steps = [f"Let me check this another way: {a} + {b} is {a} plus {b} more.",
                 f"Counting on from {a} by {b} gives {answer}.", "That agrees with the first method."]
    elif rng.random() < 0.5:
        steps.insert(0, "Let's solve this step by step.")
    steps.append(f"So the answer is {answer}." if not check else f"The final answer is {answer}.")
    return " ".join(steps)


def seed_groups(store, run_name: str, groups, seed: int) -> list[int]:
    import numpy as np

    from reflexdb import GroupIn, TaskIn, TrajectoryIn, TurnIn

    rng = np.random.default_rng(seed + 1)
    run = store.create_run(run_name)
    tasks = store.add_tasks(run, [TaskIn(q, truth, dataset="arithmetic-bench", task_key=f"{run_name}-{i}")
                                  for i, (q, truth, _) in enumerate(groups)])
    ids = []
    for task, (_, _, trajs) in zip(tasks, groups):
        members = []
        for prompt, response, reward, correct, question, text in trajs:
            T = len(response)
            members.append(TrajectoryIn(
                prompt_ids=prompt, response_ids=response,
                logprobs=-rng.exponential(0.7, T).astype(np.float32), reward=reward, correct=correct,
                turns=[TurnIn("user", question), TurnIn("assistant", text, 0, T)],
                extracted_answer=text.rsplit(" ", 1)[-1].rstrip("."),
            ))
        ids.append(store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0,
                                             trajectories=members)).group_id)
    return ids


# ---------------------------------------------------------------------------------------------- timers


class Timers:
    """Wall and process-CPU seconds per phase, per call."""

    def __init__(self):
        self.calls: dict[str, list[tuple[float, float]]] = {}
        self.padded_tokens = 0
        self.max_abs_ratio_log = 0.0
        self.grad_norm = None
        self.batch_tokens = (0, 0)

    def reset(self) -> None:
        self.__init__()

    def add(self, phase: str, wall: float, cpu: float) -> None:
        self.calls.setdefault(phase, []).append((wall, cpu))

    def wrap(self, fn, phase):
        """``phase``: a name, or a callable ``(args, kwargs) -> name`` evaluated before the call."""

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            name = phase(args, kwargs) if callable(phase) else phase
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - w, time.process_time() - c)

        return timed

    def summary(self) -> dict:
        return {k: {"n": len(v), "wall_s": sum(x[0] for x in v), "cpu_s": sum(x[1] for x in v),
                    "median_wall_s": statistics.median(x[0] for x in v), "min_wall_s": min(x[0] for x in v)}
                for k, v in self.calls.items()}


def instrument(learner, timers: Timers) -> None:
    """Wrap the learner's collaborators with timers (instance attributes; module names it imported)."""
    import torch

    from reflexdb.trainer import learner as learner_mod

    eng = learner.engine
    learner.store.read_groups = timers.wrap(learner.store.read_groups, "read_groups")
    learner.store.record_step = timers.wrap(learner.store.record_step, "record")
    learner.tracker.log_metrics = timers.wrap(learner.tracker.log_metrics, "mlflow")
    real_pack = learner_mod.pack

    def pack(*args, **kwargs):
        batch = real_pack(*args, **kwargs)
        timers.batch_tokens = (int(batch.prompt_lengths.sum()), int(batch.response_lengths.sum()))
        return batch

    learner_mod.pack = timers.wrap(pack, "pack")

    real_tlp = eng.token_logprobs

    def token_logprobs(input_ids, *args, **kwargs):
        if kwargs.get("grad", True):
            timers.padded_tokens += int(input_ids.numel())  # [B, L] of the training forwards
        return real_tlp(input_ids, *args, **kwargs)

    eng.token_logprobs = timers.wrap(token_logprobs, lambda a, kw: "train_fwd" if kw.get("grad", True) else "pi_old_fwd")
    eng.backward = timers.wrap(eng.backward, "backward")
    def step_phase(args, kwargs):
        if not eng.ds.is_gradient_accumulation_boundary():
            return "micro_step"
        # Not timed: the gradient norm before clipping, because engine.step() returns None on this
        # configuration (see docs/benchmarks-learner.md); it shows the gradient is not trivial.
        grads = [p.grad for p in eng.ds.module.parameters() if p.grad is not None]
        timers.grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        return "optimizer"

    eng.step = timers.wrap(eng.step, step_phase)

    import dataclasses

    def timed_loss(real_fn):
        @functools.wraps(real_fn)
        def loss_fn(logprobs, old, adv, mask, *args, **kwargs):
            w, c = time.perf_counter(), time.process_time()
            out = real_fn(logprobs, old, adv, mask, *args, **kwargs)
            timers.add("loss", time.perf_counter() - w, time.process_time() - c)
            with torch.no_grad():
                d = ((logprobs.detach() - old).abs() * mask).max() if mask.any() else torch.tensor(0.0)
            timers.max_abs_ratio_log = max(timers.max_abs_ratio_log, float(d))
            return out
        return loss_fn

    # each loss term's family (the learner calls spec.call, which calls spec.fn)
    learner.specs = [dataclasses.replace(spec, fn=timed_loss(spec.fn)) for spec in learner.specs]


PHASES = ("read_groups", "pack", "pi_old_fwd", "train_fwd", "loss", "backward", "micro_step", "optimizer",
          "record", "mlflow")


# ---------------------------------------------------------------------------------------------- child


def child(spec: dict) -> dict:
    """One configuration, in its own process: seed, set up, warm up, time steps, time publish."""
    import torch

    torch.set_num_threads(spec["threads"])
    from transformers import AutoTokenizer

    from reflexdb import Store
    from reflexdb.models import smollm2_dir
    from reflexdb.config import parse_config
    from reflexdb.db import make_engine
    from reflexdb.trainer.learner import Learner

    res: dict = {"spec": spec}
    t0 = time.perf_counter()
    store = Store(make_engine(spec["url"]))
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    G, n = spec["group_size"], spec["groups"]
    n_total = spec["warmup_groups"] + spec["steps"] * n
    data = make_group_data(tok, n_total, G, spec["length"], spec["seed"])
    ids = seed_groups(store, spec["name"], data, spec["seed"])
    res["seed_s"] = time.perf_counter() - t0
    res["prompt_tokens_mean"] = statistics.mean(len(t[0]) for _, _, ts in data for t in ts)
    res["response_tokens_mean"] = statistics.mean(len(t[1]) for _, _, ts in data for t in ts)
    res["reward_mean"] = statistics.mean(t[2] for _, _, ts in data for t in ts)
    log(f"{spec['name']}: seeded {len(ids)} groups × {G} in {res['seed_s']:.1f} s (prompt "
        f"{res['prompt_tokens_mean']:.1f}, response {res['response_tokens_mean']:.1f} tokens on average)")

    cfg = parse_config({
        "run": spec["name"], "model": spec["model"], "max_staleness": 1000,
        "collector": {"group_size": G, "sampling": {"max_new_tokens": spec["length"] + spec["length"] // 2}},
        "learner": {"groups_per_step": n, "micro_batch_size": spec["micro"], "lr": spec["lr"],
                    "pi_old": spec["pi_old"]},
    })
    msgs: list[str] = []
    learner = Learner(cfg, store, echo=msgs.append)
    timers = Timers()
    publish_calls: list[float] = []
    real_publish = learner.publish

    def publish():
        w = time.perf_counter()
        real_publish()
        publish_calls.append(time.perf_counter() - w)

    learner.publish = publish
    w, c = time.perf_counter(), time.process_time()
    learner.setup()
    res["setup_s"], res["setup_cpu_s"] = time.perf_counter() - w, time.process_time() - c
    res["publish_v0_s"] = publish_calls[0] if publish_calls else None
    res["torch_threads"] = torch.get_num_threads()
    res["n_micro"] = learner.n_micro
    res["rss_after_setup_mib"] = peak_rss_mib()
    log(f"{spec['name']}: setup {res['setup_s']:.1f} s (publish v0 {res['publish_v0_s'] or 0:.1f} s), "
        f"{learner.n_micro} micro-batches/step, torch threads {res['torch_threads']}")
    instrument(learner, timers)

    steps = []
    plan = [("warmup", ids[: spec["warmup_groups"]])] + [
        ("step", ids[spec["warmup_groups"] + i * n: spec["warmup_groups"] + (i + 1) * n]) for i in range(spec["steps"])]
    for kind, gids in plan:
        timers.reset()
        w, c = time.perf_counter(), time.process_time()
        r = learner.step(gids)
        wall, cpu = time.perf_counter() - w, time.process_time() - c
        m = r.metrics
        ph = timers.summary()
        resp_tokens = m["perf/tokens_per_s"] * m["perf/step_seconds"]
        s = {
            "kind": kind, "groups": len(gids), "rows": len(gids) * G, "wall_s": wall, "cpu_s": cpu,
            "loss": r.loss, "skipped": r.skipped, "response_tokens": round(resp_tokens),
            "padded_tokens": timers.padded_tokens,
            "perf_batch_seconds": m["perf/batch_seconds"], "perf_step_seconds": m["perf/step_seconds"],
            "perf_tokens_per_s": m["perf/tokens_per_s"], "grad_norm": m.get("policy/grad_norm"),
            "grad_norm_bench": timers.grad_norm, "prompt_tokens": timers.batch_tokens[0],
            "reward_mean": m["reward/mean"], "groups_some_pass": m["groups/some_pass"],
            "max_abs_logp_minus_old": timers.max_abs_ratio_log, "phases": ph,
            "rss_peak_mib": peak_rss_mib(), "loadavg": os.getloadavg(),
        }
        s["other_s"] = wall - sum(v["wall_s"] for v in ph.values())
        steps.append(s)
        fwd = ph.get("train_fwd", {})
        log(f"{spec['name']}: {kind} on {len(gids)} groups: {wall:.1f} s wall, {cpu:.1f} s CPU, loss {r.loss:.4f}, "
            f"{resp_tokens / wall:.1f} response tokens/s; π_old {ph.get('pi_old_fwd', {}).get('wall_s', 0):.1f} s, "
            f"fwd {fwd.get('wall_s', 0):.1f} s, bwd {ph.get('backward', {}).get('wall_s', 0):.1f} s, "
            f"optimizer {ph.get('optimizer', {}).get('wall_s', 0):.2f} s; peak RSS {s['rss_peak_mib']:.0f} MiB; "
            f"max|logπ−old| {timers.max_abs_ratio_log:.3g}")
    res["steps"] = steps

    if spec["publish"]:
        pt: dict[str, float] = {}
        eng = learner.engine
        real_save, real_export = eng.save_state, eng.export_hf
        eng.save_state = lambda *a, **k: _timed(pt, "save_state", real_save, *a, **k)
        eng.export_hf = lambda *a, **k: _timed(pt, "export_hf", real_export, *a, **k)
        learner.publish()
        pt["total"] = publish_calls[-1]
        states = learner.ckpt_dir / "states" / f"step-{learner.step_no}"
        pt["state_mib"] = du_mib(states)
        pt["hf_mib"] = du_mib(learner.ckpt_dir / f"v{learner.version}")
        res["publish"] = pt
        log(f"{spec['name']}: publish {pt['total']:.1f} s (DeepSpeed state {pt['save_state']:.1f} s, "
            f"{pt['state_mib']:.0f} MiB; HF export + sha256 {pt['export_hf']:.1f} s, {pt['hf_mib']:.0f} MiB)")
    res["rss_peak_mib"] = peak_rss_mib()
    learner.tracker.close()
    store.close()
    return res


def _timed(acc: dict, key: str, fn, *a, **k):
    w = time.perf_counter()
    try:
        return fn(*a, **k)
    finally:
        acc[key] = time.perf_counter() - w


# ---------------------------------------------------------------------------------------------- parent


class LoadSampler(threading.Thread):
    """Samples the 1-minute load average every ``every`` seconds."""

    def __init__(self, every: float = 15.0):
        super().__init__(daemon=True)
        self.every, self.samples, self._stop_evt = every, [], threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop_evt.wait(self.every)

    def stop(self) -> list[float]:
        self._stop_evt.set()
        self.join()
        return self.samples


@contextlib.contextmanager
def scratch_database(admin_url: str | None, name: str, tmp: Path):
    """A migrated database for a benchmark, yielding its URL: ``name`` made on the server at
    ``admin_url`` and dropped afterwards, or (no URL) a fresh embedded server in ``tmp/pgdata``,
    stopped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    from reflexdb import migrate
    from reflexdb.db import libpq_url, make_engine

    if admin_url:
        with psycopg.connect(libpq_url(admin_url), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    else:
        from reflexdb import embedded

        url = embedded.server_uri(tmp / "pgdata")
    try:
        engine = make_engine(url)
        migrate.upgrade(engine)
        engine.dispose()
        yield url
    finally:
        if admin_url:
            with psycopg.connect(libpq_url(admin_url), autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            from reflexdb import embedded

            embedded.stop(tmp / "pgdata")


def machine_info() -> dict:
    import deepspeed
    import torch
    import transformers

    info = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "torch": torch.__version__, "transformers": transformers.__version__, "deepspeed": deepspeed.__version__,
            "cuda": torch.cuda.is_available(), **host_facts()}
    return info


def plan(args) -> list[dict]:
    base = {"model": args.model, "group_size": args.group_size, "lr": args.lr, "threads": args.threads, "seed": args.seed,
            "warmup_groups": args.warmup_groups, "steps": args.steps}
    specs = []
    for T in args.lengths:
        specs.append({**base, "name": f"T{T}-g{args.groups}-m8-recompute", "length": T, "groups": args.groups,
                      "micro": 8, "pi_old": "recompute", "publish": True})
        if T == args.lengths[0]:
            specs.append({**base, "name": f"T{T}-g{args.groups}-m8-behaviour", "length": T, "groups": args.groups,
                          "micro": 8, "pi_old": "behaviour", "publish": False})
            for m in args.sweep_micro if args.sweep_groups else ():
                specs.append({**base, "name": f"T{T}-g{args.sweep_groups}-m{m}-recompute", "length": T,
                              "groups": args.sweep_groups, "micro": m, "pi_old": "recompute", "publish": False})
    if args.quick:
        specs = [{**base, "name": f"T{args.lengths[0]}-g{args.groups}-m8-recompute", "length": args.lengths[0],
                  "groups": args.groups, "micro": 8, "pi_old": "recompute", "publish": True}]
    if args.only:
        wanted = set(args.only.split(","))
        specs = [s for s in specs if s["name"] in wanted]
    return specs


def run_child(spec: dict, home: Path, args) -> dict:
    env = dict(os.environ, REFLEXDB_HOME=str(home), OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("REFLEXDB_MODEL_CACHE", "/tmp/reflexdb-models")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    sampler = LoadSampler()
    sampler.start()
    w = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                          stdout=subprocess.PIPE, text=True)
    loads = sampler.stop()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"configuration {spec['name']} failed (exit {proc.returncode}); see its log above")
    res = json.loads(lines[-1][len(RESULT_MARK):])
    res["process_s"] = time.perf_counter() - w
    res["loadavg_1min_samples"] = loads
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an external PostgreSQL (SQLAlchemy URL); default: a fresh embedded server")
    ap.add_argument("--quick", action="store_true", help="one configuration, 1 group × 8, one timed step")
    ap.add_argument("--model", default="smollm2", help="smollm2 (the benchmark), or tiny (a smoke test of this script)")
    ap.add_argument("--groups", type=int, default=16, help="groups per step (the issue's batch: 16)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lengths", default="64,256", help="mean response lengths, comma-separated")
    ap.add_argument("--sweep-groups", type=int, default=4, help="groups per step of the micro-batch sweep (0: none)")
    ap.add_argument("--sweep-micro", default="4,8,16", help="micro-batch sizes of the sweep")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per configuration (after the warm-up)")
    ap.add_argument("--warmup-groups", type=int, default=1, help="groups of the first (warm-up) step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="configuration names to run, comma-separated")
    ap.add_argument("--json-out", help="write the results here as JSON (rewritten after each configuration)")
    ap.add_argument("--report", metavar="JSON", help="print the markdown tables of a results file and exit")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (database, checkpoints)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        res = child(json.loads(args.child))
        print(RESULT_MARK + json.dumps(res, default=str), flush=True)
        return 0
    if args.report:
        print(markdown(json.loads(Path(args.report).read_text())))
        return 0
    if args.quick:
        args.groups, args.steps, args.warmup_groups, args.lengths = 1, 1, 1, "64"
    args.lengths = [int(x) for x in args.lengths.split(",") if x]
    args.sweep_micro = [int(x) for x in args.sweep_micro.split(",") if x]
    specs = plan(args)

    tmp = Path(tempfile.mkdtemp(prefix="reflexdb-learner-bench-"))
    try:
        with scratch_database(args.url, f"reflexdb_learner_bench_{os.getpid()}", tmp) as url:
            results = {
                "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "machine": machine_info(), "loadavg_start": os.getloadavg(), "configs": [],
                "args": {k: v for k, v in vars(args).items() if k not in ("url", "child")},
            }
            log(f"machine: {results['machine']}; load average {results['loadavg_start']}")
            log(f"configurations: {', '.join(s['name'] for s in specs)}")
            t0 = time.perf_counter()
            try:
                for spec in specs:
                    home = tmp / f"home-{spec['name']}"
                    log(f"--- {spec['name']} (load average {os.getloadavg()[0]:.2f})")
                    try:
                        results["configs"].append(run_child({**spec, "url": url}, home, args))
                    finally:
                        shutil.rmtree(home, ignore_errors=True)
                    if args.json_out:
                        Path(args.json_out).write_text(json.dumps(results, indent=2, default=str) + "\n")
            finally:
                results["loadavg_end"] = os.getloadavg()
                results["total_s"] = round(time.perf_counter() - t0, 1)
                if args.json_out:
                    Path(args.json_out).write_text(json.dumps(results, indent=2, default=str) + "\n")
                if results["configs"]:
                    print(markdown(results))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


# ---------------------------------------------------------------------------------------------- report


def _f(x, nd=1) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def _mm(p) -> str:
    if not p:
        return "–"
    return f"{p['median_wall_s']:.2f}" + (f" ({p['min_wall_s']:.2f})" if "min_wall_s" in p else "")


def _g(x) -> str:
    return "–" if x is None else f"{x:.3g}"


def markdown(results: dict) -> str:
    out = []
    head = ("| configuration | rows (groups×G) | micro-batches | π_old | step wall (s) | step CPU (s) | "
            "cores used (CPU/wall) | response tok/s | all tok/s | learner perf/tokens_per_s | perf/batch_seconds | "
            "load avg (1 min) at step end | peak RSS (MiB) |")
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for c in results["configs"]:
        s = c["spec"]
        for st in c["steps"]:
            label = s["name"] + (" (warm-up)" if st["kind"] == "warmup" else "")
            all_tok = st["response_tokens"] + st["prompt_tokens"]
            out.append(
                f"| {label} | {st['rows']} ({st['groups']}×{s['group_size']}) | {c['n_micro']} | {s['pi_old']} | "
                f"{st['wall_s']:.1f} | {st['cpu_s']:.1f} | {st['cpu_s'] / st['wall_s']:.2f} | "
                f"{st['response_tokens'] / st['wall_s']:.1f} | {all_tok / st['wall_s']:.1f} | "
                f"{st['perf_tokens_per_s']:.1f} | {st['perf_batch_seconds']:.3f} | {st['loadavg'][0]:.1f} | "
                f"{st['rss_peak_mib']:.0f} |")
    out.append("")
    head = "| configuration | step | " + " | ".join(PHASES) + " | other | sum |"
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for c in results["configs"]:
        for st in c["steps"]:
            ph = st["phases"]
            cells = [_f(ph.get(p, {}).get("wall_s"), 3 if p in ("read_groups", "pack", "record", "mlflow",
                                                                  "micro_step", "loss") else 1)
                     for p in PHASES]
            out.append(f"| {c['spec']['name']} | {st['kind']} | " + " | ".join(cells) +
                       f" | {st['other_s']:.3f} | {st['wall_s']:.1f} |")
    out.append("")
    head = ("| configuration | step | padded tokens / row | π_old fwd per micro-batch, median (min) s | "
            "train fwd per micro-batch | backward per micro-batch | max abs(logπ − π_old) | loss | policy/grad_norm (learner) | grad norm (benchmark) |")
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for c in results["configs"]:
        for st in c["steps"]:
            ph = st["phases"]
            out.append(
                f"| {c['spec']['name']} | {st['kind']} | {st['padded_tokens'] / st['rows']:.1f} | "
                f"{_mm(ph.get('pi_old_fwd'))} | {_mm(ph.get('train_fwd'))} | {_mm(ph.get('backward'))} | "
                f"{st['max_abs_logp_minus_old']:.3g} | "
                f"{st['loss']:.4f} | {_g(st['grad_norm'])} | {_g(st['grad_norm_bench'])} |")
    out.append("")
    head = "| configuration | setup (s) | publish v0 in setup (s) | publish (s) | DeepSpeed state (s, MiB) | HF export + sha256 (s, MiB) |"
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for c in results["configs"]:
        p = c.get("publish")
        pub = (f"{p['total']:.1f} | {p['save_state']:.1f}, {p['state_mib']:.0f} | {p['export_hf']:.1f}, {p['hf_mib']:.0f}"
               if p else "– | – | –")
        out.append(f"| {c['spec']['name']} | {c['setup_s']:.1f} | {_f(c.get('publish_v0_s'))} | {pub} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
