"""Collector throughput against raw generation: what do the store and the bookkeeping cost?

One process, one model, one engine object, one PostgreSQL server. For each ``tasks_per_batch``
in ``--tasks-per-batch`` the benchmark runs, alternating to cancel drift (other jobs share the
machine)::

    warm-up (collector, not counted), then  a, b, a, b, ...   (``--rounds`` pairs)

a. **raw**: ``engine.generate(prompts, n=G, params)`` over the same task sequence, with the same
   per-call seeds, and nothing else (no store, no rewards);
b. **collector**: ``Collector(cfg, store, engine).setup()`` then ``run(max_groups=N)`` (timed:
   ``run`` only, which includes its shutdown bookkeeping), writing to a real PostgreSQL. Each b
   run gets a fresh database cloned from a migrated template, so task ids, and therefore the
   claim order, are the same every time.

Fairness: the collector seeds each ``generate`` call from ``np.random.default_rng([cfg.seed,
os.getpid()])``; the raw loop draws the same seeds in the same process and replays the task
sequence the warm-up run claimed (read back from the database). Both therefore generate
**identical tokens**; the benchmark checks this after every b run by reading the stored response
token ids back and comparing them with the raw run's, and says so. (If they ever differ, compare
the tokens/s columns, not trajectories/s.)

Reported per run: wall time, trajectories/s, new tokens/s, CPU seconds of this process and of
the embedded server; per pair: overhead = 1 - b/a (throughput); overall: the same over the summed
times. Inside b, the collector's methods (and the engine's ``generate``) are wrapped with timers
(a few calls per group, well under a microsecond each) to split a group's time into generate /
rewards / records / write / admission / reload check / claim and loop / progress and shutdown.
That split gives a second, drift-free measure of the overhead: the share of ``run()`` spent
outside ``generate``. A third number compares the same ``generate`` calls inside the collector
with the raw loop (1.0 = same speed): on a shared machine, the a/b overhead is only as good as
that ratio is close to what the split explains.

Optionally (``--hf-generate``, on by default) HF transformers' own ``model.generate`` on the
same prompts and seeds (sampling with ``top_k=0``, ``num_return_sequences=G``) once after the
rounds, as a reference point: it samples different tokens, so compare its tokens/s only.

Quick run (about a minute and a half once the model is cached)::

    REFLEXDB_MODEL_CACHE=/tmp/reflexdb-models python benchmarks/collect_bench.py --quick

Full run (the numbers in docs/benchmarks-collector.md: 7.3 minutes on 2 cores at load 3; one torch
thread, because two threads spinning on two shared cores collapse under any other load)::

    REFLEXDB_MODEL_CACHE=/tmp/reflexdb-models python benchmarks/collect_bench.py --threads 1 --json-out /tmp/collect.json

``--url`` uses an external server instead of a temporary embedded one (the benchmark creates
and drops its own databases there; the role needs CREATEDB). ``--profile FILE`` runs one extra
collector pass under cProfile afterwards and prints where its non-generation time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import platform
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psycopg

from reflexdb import Store, migrate
from reflexdb.collector.engines import SamplingParams
from reflexdb.collector.engines.base import encode_prompt
from reflexdb.collector.engines.hf import HFEngine
from reflexdb.models import resolve_model
from reflexdb.collector.runner import Collector
from reflexdb.collector.sources import prompt_messages
from reflexdb.config import Config, parse_config
from reflexdb.db import libpq_url, make_engine

from machine import cpu_model, server_cpu

GSM8K = Path("/work/shared/data/gsm8k/train.jsonl")


def log(msg: str) -> None:
    print(f"[collect-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- databases


class Databases:
    """A server with a migrated template database; ``fresh()`` clones it for each collector run."""

    def __init__(self, url: str | None, workdir: str | None):
        from sqlalchemy.engine import make_url

        self.tmp: Path | None = None
        self.created: list[str] = []
        if url:
            self.admin_url = url
        else:
            from reflexdb import embedded

            self.tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="reflexdb-collect-bench-"))
            self.admin_url = embedded.server_uri(self.tmp / "pgdata")
        self._base = make_url(self.admin_url)
        self.template = f"collect_bench_{os.getpid()}_template"
        self._create(self.template)
        engine = make_engine(self.url(self.template))
        migrate.upgrade(engine)
        engine.dispose()
        self._n = 0

    @property
    def pgdata(self) -> Path | None:
        """The embedded server's data directory (None for ``--url``)."""
        return None if self.tmp is None else self.tmp / "pgdata"

    def url(self, db: str) -> str:
        return self._base.set(database=db).render_as_string(hide_password=False)

    def _create(self, db: str, template: str | None = None) -> None:
        with psycopg.connect(libpq_url(self.admin_url), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{db}"' + (f' TEMPLATE "{template}"' if template else ""))
        self.created.append(db)

    def fresh(self) -> str:
        self._n += 1
        db = f"collect_bench_{os.getpid()}_{self._n}"
        self._create(db, self.template)
        return self.url(db)

    def server_version(self) -> str:
        with psycopg.connect(libpq_url(self.admin_url)) as c:
            return c.execute("SHOW server_version").fetchone()[0]

    def close(self, keep: bool) -> None:
        if self.tmp is not None:
            from reflexdb import embedded

            embedded.stop(self.tmp / "pgdata")
            if not keep:
                shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if not keep:
            with psycopg.connect(libpq_url(self.admin_url), autocommit=True) as c:
                for db in reversed(self.created):
                    c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


# ---------------------------------------------------------------------------------------------- CPU accounting


def self_cpu() -> float:
    """CPU seconds (user + system, all threads) used so far by this process."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def server_delta(s0: float | None, s1: float | None) -> float | None:
    # A server process that exits in between (an autovacuum worker) takes its CPU time with it.
    return None if s0 is None or s1 is None else max(0.0, s1 - s0)


# ---------------------------------------------------------------------------------------------- runs


@dataclass
class Result:
    kind: str  # raw | collector | hf_generate
    tasks_per_batch: int
    round: int
    seconds: float
    trajectories: int
    tokens: int
    cpu: float = 0.0  # CPU seconds of this process during the run (all threads)
    server_cpu: float | None = None  # CPU seconds of the embedded PostgreSQL during the run
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds, collector runs only
    identical: bool | None = None  # collector runs: same tokens as the raw run of the round

    @property
    def traj_s(self) -> float:
        return self.trajectories / self.seconds

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    def row(self) -> dict:
        return {"kind": self.kind, "tasks_per_batch": self.tasks_per_batch, "round": self.round,
                "seconds": round(self.seconds, 3), "trajectories": self.trajectories, "tokens": self.tokens,
                "trajectories_per_s": round(self.traj_s, 3), "tokens_per_s": round(self.tok_s, 2),
                "process_cpu_s": round(self.cpu, 2),
                "server_cpu_s": None if self.server_cpu is None else round(self.server_cpu, 3),
                "identical_tokens": self.identical, "breakdown_s": {k: round(v, 4) for k, v in self.breakdown.items()}}


def make_config(args, tasks_per_batch: int) -> Config:
    if args.tasks == "gsm8k":
        tasks = {"source": "file", "path": str(args.gsm8k), "train_size": max(args.groups, 16), "eval_size": 0,
                 "dataset": "gsm8k"}
    else:
        tasks = {"source": "arithmetic", "level": args.level, "train_size": min(80, max(args.groups, 16)),
                 "eval_size": 8}
    return parse_config({
        "run": "collect-bench", "model": args.model, "seed": args.seed,
        "tasks": {**tasks, "template": args.template},
        "collector": {"group_size": args.group_size, "tasks_per_batch": tasks_per_batch,
                      "sampling": {"temperature": args.temperature, "top_p": args.top_p,
                                   "max_new_tokens": args.max_new_tokens}},
        # Admission lets a collector run ahead of the learner by (eta + 1) * groups_per_step groups;
        # there is no learner here, so make the bound larger than one run (the check still runs).
        "learner": {"groups_per_step": max(16, args.groups)},
    })


def seeds_like_collector(cfg: Config, count: int) -> list[int]:
    """The per-call seeds Collector.sample draws (same derivation, same process id)."""
    rng = np.random.default_rng([cfg.seed, os.getpid()])
    return [int(rng.integers(2**31)) for _ in range(count)]


def batches_of(seq: list, k: int) -> list[list]:
    return [seq[i : i + k] for i in range(0, len(seq), k)]


def sampling_params(cfg: Config, seed: int) -> SamplingParams:
    s = cfg.collector.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                          stop=tuple(s.stop), seed=seed)


def run_raw(engine: HFEngine, cfg: Config, batches: list[list[list[dict]]], seeds: list[int], pgdata: Path | None,
            rnd: int) -> tuple[Result, list[list[np.ndarray]]]:
    """a: generate over the task sequence, nothing else. Returns the result and the token ids."""
    G = cfg.collector.group_size
    params = [sampling_params(cfg, s) for s in seeds]
    trajs = tokens = 0
    ids: list[list[np.ndarray]] = []
    c0, s0 = self_cpu(), server_cpu(pgdata)
    t0 = time.perf_counter()
    for prompts, p in zip(batches, params):
        for group in engine.generate(prompts, n=G, params=p):
            trajs += len(group)
            tokens += sum(len(s.token_ids) for s in group)
            ids.append([s.token_ids for s in group])
    seconds = time.perf_counter() - t0
    s1 = server_cpu(pgdata)
    r = Result("raw", cfg.collector.tasks_per_batch, rnd, seconds, trajs, tokens, cpu=self_cpu() - c0,
               server_cpu=server_delta(s0, s1))
    return r, ids


def timed(fn, acc: dict, key: str):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0

    return wrapper


def run_collector(engine: HFEngine, cfg: Config, url: str, n_groups: int, pgdata: Path | None, rnd: int, *,
                  profile: cProfile.Profile | None = None) -> tuple[Result, Store, int]:
    """b: a Collector on a fresh database. Returns the result, the (open) store and the run id."""
    store = Store.open(url)
    messages: list[str] = []
    collector = Collector(cfg, store, engine, echo=messages.append)
    t0 = time.perf_counter()
    collector.setup()
    setup_s = time.perf_counter() - t0
    acc: dict[str, float] = {}
    # Instance attributes shadow the methods: the loop calls these wrappers.
    for name in ("_maybe_reload", "_admitted", "_write", "_report"):
        setattr(collector, name, timed(getattr(collector, name), acc, name))
    # The workflow's collect (prompts, seed, generate, scoring) and the scoring of samples
    # (reward_fn + the records) it calls back on the collector.
    collector.score = timed(collector.score, acc, "_group")
    for workflow in collector.workflows:
        workflow.collect = timed(workflow.collect, acc, "_collect")
    shutdown = collector._shutdown

    def timed_shutdown(*a, **k):  # _shutdown calls _report: count that part as _report only
        r0, t0 = acc.get("_report", 0.0), time.perf_counter()
        try:
            return shutdown(*a, **k)
        finally:
            acc["_shutdown"] = time.perf_counter() - t0 - (acc.get("_report", 0.0) - r0)

    collector._shutdown = timed_shutdown
    collector.reward_fn = timed(collector.reward_fn, acc, "reward_fn")
    gen = timed(engine.generate, acc, "generate")
    engine.generate = gen  # instance attribute on the shared engine; removed below
    try:
        c0, s0 = self_cpu(), server_cpu(pgdata)
        t0 = time.perf_counter()
        if profile is not None:
            profile.enable()
        stats = collector.run(max_groups=n_groups)
        if profile is not None:
            profile.disable()
        seconds = time.perf_counter() - t0
        c1, s1 = self_cpu(), server_cpu(pgdata)
    finally:
        del engine.generate
    acc["setup"] = setup_s
    r = Result("collector", cfg.collector.tasks_per_batch, rnd, seconds, stats.trajectories, stats.tokens, cpu=c1 - c0,
               server_cpu=server_delta(s0, s1), breakdown=acc)
    return r, store, collector.run_id


def stored_sequence(store: Store, run_id: int) -> list[tuple[str, list[np.ndarray]]]:
    """(prompt, response token ids of each trajectory) of every group, in write order."""
    with store.transaction() as conn:
        rows = conn.execute("SELECT g.id, t.prompt FROM groups g JOIN tasks t ON t.id = g.task_id "
                            "WHERE g.run_id = %s ORDER BY g.id", (run_id,)).fetchall()
    groups = store.read_groups([r[0] for r in rows], payloads=True, turns=False)
    out = []
    for (_, prompt), g in zip(rows, groups):
        trajs = sorted(g.trajectories, key=lambda t: t.index_in_group)
        out.append((prompt, [np.asarray(t.response_ids) for t in trajs]))
    return out


def breakdown(acc: dict[str, float], seconds: float) -> dict[str, float]:
    """Split a collector run's time (see the module docstring)."""
    gen = acc.get("generate", 0.0)
    collect = acc.get("_collect", 0.0)
    rewards_records = acc.get("_group", 0.0)  # reward_fn + building the GroupIn records
    named = collect + acc.get("_write", 0.0) + acc.get("_admitted", 0.0) + acc.get("_maybe_reload", 0.0) \
        + acc.get("_report", 0.0) + acc.get("_shutdown", 0.0)
    return {
        "generate": gen,
        "prompts_and_seed": collect - gen - rewards_records,
        "reward_fn": acc.get("reward_fn", 0.0),
        "records": rewards_records - acc.get("reward_fn", 0.0),
        "write_group": acc.get("_write", 0.0),
        "admission": acc.get("_admitted", 0.0),
        "reload_check": acc.get("_maybe_reload", 0.0),
        "progress_and_shutdown": acc.get("_report", 0.0) + acc.get("_shutdown", 0.0),
        "claim_and_loop": seconds - named,
        "setup_not_timed": acc.get("setup", 0.0),
    }


# ---------------------------------------------------------------------------------------------- HF reference


def run_hf_generate(engine: HFEngine, cfg: Config, batches: list[list[list[dict]]], seeds: list[int],
                    rnd: int) -> Result:
    """transformers' model.generate on the same prompts (left-padded), num_return_sequences=G."""
    import torch

    model, tok = engine.model, engine.tokenizer
    G = cfg.collector.group_size
    s = cfg.collector.sampling
    gen_cfg = model.generation_config
    eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else tok.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) | {tok.eos_token_id}
    eos_ids.discard(None)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos_ids)
    encoded = [[encode_prompt(tok, p) for p in prompts] for prompts in batches]
    trajs = tokens = 0
    c0 = self_cpu()
    t0 = time.perf_counter()
    for ids, seed in zip(encoded, seeds):
        P = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), P), pad, dtype=torch.long)
        mask = torch.zeros((len(ids), P), dtype=torch.long)
        for i, x in enumerate(ids):
            input_ids[i, P - len(x):] = torch.tensor(x)
            mask[i, P - len(x):] = 1
        torch.manual_seed(seed)
        sample = s.temperature > 0
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=mask, max_new_tokens=s.max_new_tokens,
                do_sample=sample, num_return_sequences=G, pad_token_id=pad, eos_token_id=sorted(eos_ids),
                **({"temperature": s.temperature, "top_p": s.top_p, "top_k": 0} if sample else {}),
            )
        new = out[:, P:]
        is_eos = torch.isin(new, torch.tensor(sorted(eos_ids)))
        # tokens up to and including the first EOS (what the engine and the store count)
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, torch.full((new.shape[0],), new.shape[1]))
        trajs += new.shape[0]
        tokens += int(first.sum())
    seconds = time.perf_counter() - t0
    return Result("hf_generate", cfg.collector.tasks_per_batch, rnd, seconds, trajs, tokens, cpu=self_cpu() - c0)


# ---------------------------------------------------------------------------------------------- report


def machine_info(dbs: Databases) -> dict:
    import torch
    import transformers

    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "transformers": transformers.__version__, "postgres": dbs.server_version(),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "database": "external (--url)" if dbs.tmp is None else "embedded, temporary directory"}
    if (cpu := cpu_model()) is not None:
        info["cpu"] = cpu
    return info


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def summarise(results: list[Result], tpb: int) -> dict:
    a = [r for r in results if r.kind == "raw" and r.tasks_per_batch == tpb]
    b = [r for r in results if r.kind == "collector" and r.tasks_per_batch == tpb]
    def work_cpu(r: Result) -> float:  # CPU seconds the run cost: this process plus the server
        return r.cpu + (r.server_cpu or 0.0)

    pairs = [{"round": ra.round, "overhead_traj": 1 - rb.traj_s / ra.traj_s, "overhead_tok": 1 - rb.tok_s / ra.tok_s,
              "overhead_cpu": 1 - (rb.trajectories / work_cpu(rb)) / (ra.trajectories / work_cpu(ra))}
             for ra, rb in zip(a, b)]

    def total(rs):
        return sum(r.seconds for r in rs), sum(r.trajectories for r in rs), sum(r.tokens for r in rs)

    (sa, ta, ka), (sb, tb, kb) = total(a), total(b)
    bk = [breakdown(r.breakdown, r.seconds) for r in b]
    gen_b = sum(x["generate"] for x in bk)
    return {
        "tasks_per_batch": tpb, "pairs": pairs,
        "raw": {"seconds": sa, "trajectories_per_s": ta / sa, "tokens_per_s": ka / sa,
                "cpu_s": sum(r.cpu for r in a)},
        "collector": {"seconds": sb, "trajectories_per_s": tb / sb, "tokens_per_s": kb / sb,
                      "cpu_s": sum(r.cpu for r in b), "generate_s": gen_b,
                      "server_cpu_s": None if any(r.server_cpu is None for r in b) else sum(r.server_cpu for r in b)},
        # 1 - collector/raw throughput over the summed times of all rounds, and the median pair
        "overhead_traj": 1 - (tb / sb) / (ta / sa), "overhead_tok": 1 - (kb / sb) / (ka / sa),
        "overhead_median_pair": float(np.median([p["overhead_traj"] for p in pairs])),
        # The same in trajectories per CPU second (process + embedded server): on a shared machine
        # a run's wall time includes waiting for a core, its CPU time does not.
        "overhead_cpu": 1 - (tb / sum(work_cpu(r) for r in b)) / (ta / sum(work_cpu(r) for r in a)),
        "identical_tokens": all(r.identical for r in b),
        # Direct measure, immune to drift between runs: the share of the collector's run() time
        # not spent inside engine.generate (everything the store and the bookkeeping cost).
        "collector_time_outside_generate": (sb - gen_b) / sb,
        # The same generate calls inside the collector vs in the raw loop (1.0 = same speed).
        "generate_time_collector_over_raw": gen_b / sa,
    }


def print_tables(results: list[Result], summaries: list[dict], groups_per_run: dict[int, int]) -> None:
    print()
    print("| tasks/batch | round | run | seconds | trajectories | new tokens | trajectories/s | new tokens/s "
          "| process CPU s | PostgreSQL CPU s | same tokens as raw |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        same = "" if r.identical is None else ("yes" if r.identical else "NO")
        server = "" if r.server_cpu is None else f"{r.server_cpu:.2f}"
        print(f"| {r.tasks_per_batch} | {r.round} | {r.kind} | {r.seconds:.2f} | {r.trajectories} | {r.tokens} | "
              f"{r.traj_s:.3f} | {r.tok_s:.1f} | {r.cpu:.1f} | {server} | {same} |")
    print()
    print("| tasks/batch | raw trajectories/s | collector trajectories/s | raw tokens/s | collector tokens/s | "
          "overhead (summed times) | overhead per pair | overhead in CPU time (per pair) | "
          "collector time outside generate | generate time in collector / raw |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in summaries:
        per_pair = ", ".join(f"{100 * p['overhead_traj']:+.1f}%" for p in s["pairs"])
        per_pair_cpu = ", ".join(f"{100 * p['overhead_cpu']:+.1f}%" for p in s["pairs"])
        print(f"| {s['tasks_per_batch']} | {s['raw']['trajectories_per_s']:.3f} | "
              f"{s['collector']['trajectories_per_s']:.3f} | {s['raw']['tokens_per_s']:.1f} | "
              f"{s['collector']['tokens_per_s']:.1f} | {100 * s['overhead_traj']:+.2f}% | {per_pair} | "
              f"{100 * s['overhead_cpu']:+.2f}% ({per_pair_cpu}) | "
              f"{100 * s['collector_time_outside_generate']:.2f}% | {s['generate_time_collector_over_raw']:.3f} |")
    print()
    keys = ["generate", "reward_fn", "records", "write_group", "admission", "reload_check", "claim_and_loop",
            "progress_and_shutdown", "prompts_and_seed"]
    print("Collector time per group, ms (mean over its b runs):")
    print()
    print("| tasks/batch | " + " | ".join(keys) + " |")
    print("|---:|" + "---:|" * len(keys))
    for tpb, n in groups_per_run.items():
        b = [r for r in results if r.kind == "collector" and r.tasks_per_batch == tpb]
        if not b:
            continue
        bk = [breakdown(r.breakdown, r.seconds) for r in b]
        groups = n * len(b)
        print(f"| {tpb} | " + " | ".join(f"{1000 * sum(x[k] for x in bk) / groups:.2f}" for k in keys) + " |")
    print()


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="1-2 minutes: 2 groups per run, 32 new tokens, tasks_per_batch 1, no HF reference")
    ap.add_argument("--url", help="external PostgreSQL admin URL (default: a temporary embedded server)")
    ap.add_argument("--workdir", help="directory for the embedded server (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the databases / data directory")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tasks", choices=["arithmetic", "gsm8k"], default="arithmetic")
    ap.add_argument("--gsm8k", type=Path, default=GSM8K)
    ap.add_argument("--level", type=int, default=1, help="arithmetic level")
    ap.add_argument("--template", default="plain")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks-per-batch", default="1,4", help="comma-separated")
    ap.add_argument("--groups", type=int, default=4, help="groups per run (a and b)")
    ap.add_argument("--rounds", type=int, default=3, help="a/b pairs per tasks_per_batch")
    ap.add_argument("--hf-generate", action=argparse.BooleanOptionalAction, default=True,
                    help="also time transformers' model.generate on the same prompts (once, after the rounds)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--profile", type=Path, help="cProfile one extra collector run into this file")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.groups = min(args.groups, 2)
        args.max_new_tokens = min(args.max_new_tokens, 32)
        args.tasks_per_batch = "1"
        args.hf_generate = False
    tpbs = [int(x) for x in args.tasks_per_batch.split(",") if x.strip()]

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = uptime()
    log(f"load at start: {load_start}")
    t_all = time.perf_counter()
    location = resolve_model(args.model)  # converted once into REFLEXDB_MODEL_CACHE
    engine = HFEngine(location, device="cpu")
    dbs = Databases(args.url, args.workdir)
    results: list[Result] = []
    summaries: list[dict] = []
    groups_per_run: dict[int, int] = {}
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join([Path(sys.executable).name, *sys.argv]),
                 "load_start": load_start, "args": {k: str(v) for k, v in vars(args).items() if k != "url"}}

    def show(r: Result, note: str = "") -> None:
        log(f"  {r.kind:11s} round {r.round}: {r.seconds:7.2f} s  {r.traj_s:6.3f} traj/s  {r.tok_s:6.1f} tok/s  "
            f"({r.tokens} tokens, CPU {r.cpu:.1f} s{note})")

    try:
        out["machine"] = machine_info(dbs)
        log(f"machine: {out['machine']}")
        for tpb in tpbs:
            cfg = make_config(args, tpb)
            n = args.groups
            groups_per_run[tpb] = n
            # Warm-up collector run: warms the engine and the database path, and tells the task
            # sequence (the claim order on a fresh database is the same every time).
            log(f"tasks_per_batch {tpb}: warm-up collector run ({n} groups)")
            warm, store, run_id = run_collector(engine, cfg, dbs.fresh(), n, dbs.pgdata, 0)
            sequence = stored_sequence(store, run_id)
            store.close()
            show(warm, "; warm-up, not counted")
            batches = batches_of([prompt_messages(cfg.tasks.template, p) for p, _ in sequence], tpb)
            seeds = seeds_like_collector(cfg, len(batches))
            for rnd in range(1, args.rounds + 1):
                ra, raw_ids = run_raw(engine, cfg, batches, seeds, dbs.pgdata, rnd)
                results.append(ra)
                show(ra)
                rb, store, run_id = run_collector(engine, cfg, dbs.fresh(), n, dbs.pgdata, rnd)
                stored = stored_sequence(store, run_id)
                store.close()
                rb.identical = ([p for p, _ in stored] == [p for p, _ in sequence] and len(stored) == len(raw_ids)
                                and all(len(x) == len(y) and all(np.array_equal(u, v) for u, v in zip(x, y))
                                        for (_, x), y in zip(stored, raw_ids)))
                results.append(rb)
                show(rb, f", identical tokens to raw: {rb.identical}")
            if args.hf_generate:
                rc = run_hf_generate(engine, cfg, batches, seeds, args.rounds)
                results.append(rc)
                show(rc, "; its own samples")
            summaries.append(summarise(results, tpb))
        if args.profile:
            tpb = tpbs[-1]
            cfg = make_config(args, tpb)
            prof = cProfile.Profile()
            rp, store, _ = run_collector(engine, cfg, dbs.fresh(), args.groups, dbs.pgdata, 0, profile=prof)
            store.close()
            prof.dump_stats(str(args.profile))
            log(f"profile of one collector run (tasks_per_batch {tpb}, {rp.seconds:.1f} s) in {args.profile}")
            # the collector's own code and the database calls (generation is the engine's)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(r"(runner|work|store|rewards|validate)\.py", 30)
    finally:
        dbs.close(args.keep)
    out["load_end"] = uptime()
    out["total_seconds"] = round(time.perf_counter() - t_all, 1)
    log(f"load at end: {out['load_end']}; total {out['total_seconds']} s")
    print_tables(results, summaries, groups_per_run)
    out["runs"] = [r.row() for r in results]
    out["summary"] = summaries
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2, default=str) + "\n")
        log(f"results in {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
