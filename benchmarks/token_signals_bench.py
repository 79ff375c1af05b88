"""What recording per-token learner signals costs (``learner.record_token_signals``, revision 0028):
a learner step's time with and without, on CPU, for the tiny model and SmolLM2-135M, and the bytes
a ``token_signals`` row takes beside the row's ``token_bytes``.

Each model runs in a child process of its own (DeepSpeed is initialised once per process) with one
real :class:`reflexdb.trainer.learner.Learner` on a real PostgreSQL store. Its steps alternate
recording on and off (``PolicyUpdate.record_signals``, set before each step) in the order on, off,
off, on, ..., so both settings see the same machine and the same drift in its load; each step trains
fresh groups of the same shape (learner_bench.py's arithmetic groups: SmolLM2 token ids of worked
answers, mean response length ``--length``). What is timed:

- ``step``: ``Learner.step`` whole (read the groups, π_old, the loss over the micro-batches, the
  optimizer step, and the record: the step's row, its consumption and, on, its signals);
- ``record``: ``Store.record_step`` alone, the one transaction the signals are written in;
- ``compute``: on steps that record, the computation of the signals inside the update (each
  term's ``LossSpec.token_signals`` and the ``SignalRecorder``'s work, timed around each call:
  on CPU every call runs to completion), plus :meth:`Learner.token_signals` after it (the copy
  to the host and the per-row arrays): what recording adds to a step before its record, measured
  apart from the step's noise.

Bytes: ``pg_column_size`` of each ``token_signals`` row and of its ``token_bytes`` row, averaged,
and per response token. The first step (a warm-up, recording on) is not counted.

    REFLEXDB_MODEL_CACHE=/tmp/reflexdb-models python benchmarks/token_signals_bench.py --json-out /tmp/signals.json
    python benchmarks/token_signals_bench.py --report /tmp/signals.json     # the table again

``--url`` uses an external PostgreSQL (a database of its own is created and dropped; the role
needs CREATEDB); default: a fresh embedded server in a temp dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from learner_bench import make_group_data, scratch_database, seed_groups
from machine import host_facts

RESULT_MARK = "TOKEN_SIGNALS_BENCH_RESULT "


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def child(spec: dict) -> dict:
    """One model: seed the groups, set the learner up, alternate steps with and without signals."""
    import torch

    torch.set_num_threads(spec["threads"])
    from transformers import AutoTokenizer

    from reflexdb import Store
    from reflexdb.config import parse_config
    from reflexdb.db import make_engine
    from reflexdb.models import smollm2_dir
    from reflexdb.trainer.learner import Learner

    store = Store(make_engine(spec["url"]))
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    n, G, pairs = spec["groups"], spec["group_size"], spec["pairs"]
    data = make_group_data(tok, n * (1 + 2 * pairs), G, spec["length"], spec["seed"])
    ids = seed_groups(store, spec["name"], data, spec["seed"])
    cfg = parse_config({
        "run": spec["name"], "model": spec["model"], "max_staleness": 1000,
        "collector": {"group_size": G, "sampling": {"max_new_tokens": 2 * spec["length"]}},
        "learner": {"groups_per_step": n, "micro_batch_size": spec["micro"], "lr": 1e-6},
    })
    learner = Learner(cfg, store, echo=lambda msg: None)
    learner.setup()
    record_s: list[float] = []
    signals_s: list[float] = []
    real_record, real_signals = learner.store.record_step, learner.token_signals

    def record_step(*a, **k):
        w = time.perf_counter()
        out = real_record(*a, **k)
        record_s.append(time.perf_counter() - w)
        return out

    def token_signals():
        w = time.perf_counter()
        out = real_signals()
        if out is not None:
            signals_s.append(time.perf_counter() - w)
        return out

    learner.store.record_step, learner.token_signals = record_step, token_signals
    from reflexdb.trainer.losses.registry import LossSpec
    from reflexdb.trainer.update import SignalRecorder

    inside = [0.0]

    def timed(fn):
        def call(*a, **k):
            w = time.perf_counter()
            out = fn(*a, **k)
            inside[0] += time.perf_counter() - w
            return out
        return call

    LossSpec.token_signals = timed(LossSpec.token_signals)
    for name in ("__init__", "add_entropy", "add", "result"):
        setattr(SignalRecorder, name, timed(getattr(SignalRecorder, name)))
    compute_s: list[float] = []
    steps = {"on": [], "off": []}
    records = {"on": [], "off": []}
    order = ["on"] + [m for k in range(pairs) for m in (("on", "off") if k % 2 == 0 else ("off", "on"))]
    for k, mode in enumerate(order):
        learner.update.record_signals = mode == "on"
        inside[0] = 0.0
        w = time.perf_counter()
        learner.step(ids[k * n:(k + 1) * n])
        took = time.perf_counter() - w
        if k > 0:  # the first step warms up
            steps[mode].append(took)
            records[mode].append(record_s[-1])
            if mode == "on":
                compute_s.append(inside[0] + signals_s[-1])
        log(f"{spec['name']}: step {k} ({mode}) {took:.2f} s, record {record_s[-1] * 1000:.0f} ms")
    with store.engine.connect() as conn:
        sizes = conn.exec_driver_sql(
            "SELECT count(*), avg(pg_column_size(g.*)), avg(pg_column_size(b.*)), "
            "avg(length(g.entropy) / 2), avg(pg_column_size(c.*)) "
            "FROM token_signals g JOIN token_bytes b USING (trajectory_id, run_id) "
            "JOIN consumption c USING (step_id, trajectory_id, run_id)").fetchone()
        tokens = conn.exec_driver_sql(
            "SELECT avg(response_length), avg(length(b.prompt_ids) / 4) FROM trajectories t "
            "JOIN token_bytes b ON b.trajectory_id = t.id AND b.run_id = t.run_id").fetchone()
    store.close()
    return {
        "name": spec["name"], "model": spec["model"], "rows_per_step": n * G, "n_micro": learner.n_micro,
        "response_tokens_mean": float(tokens[0]), "prompt_tokens_mean": float(tokens[1]),
        "step_s": steps, "record_s": records, "compute_s": compute_s,
        "signal_rows": int(sizes[0]), "signals_row_bytes": float(sizes[1]), "token_bytes_row_bytes": float(sizes[2]),
        "signal_tokens_mean": float(sizes[3]), "consumption_row_bytes": float(sizes[4]),
    }


def run_child(spec: dict, home: Path) -> dict:
    env = dict(os.environ, REFLEXDB_HOME=str(home), OMP_NUM_THREADS=str(spec["threads"]))
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env, stdout=subprocess.PIPE,
                          text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise SystemExit(f"{spec['name']}: the child failed (exit {proc.returncode})")


def markdown(results: dict) -> str:
    lines = [
        "| model | rows × response tokens a step | step, signals off (median) | step, signals on (median) | on / off "
        "| record_step off / on | computing the signals (share of the step) | bytes a signals row (a token) "
        "| its token_bytes row |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results["configs"]:
        off, on = statistics.median(c["step_s"]["off"]), statistics.median(c["step_s"]["on"])
        r_off, r_on = statistics.median(c["record_s"]["off"]), statistics.median(c["record_s"]["on"])
        sig = statistics.median(c["compute_s"]) if c["compute_s"] else float("nan")
        extra = sig + r_on - r_off  # what recording adds: the computation and the longer record
        per_token = c["signals_row_bytes"] / max(c["signal_tokens_mean"], 1)
        lines.append(
            f"| {c['model']} | {c['rows_per_step']} × {c['response_tokens_mean']:.0f} ({c['n_micro']} passes) "
            f"| {off:.2f} s | {on:.2f} s | {on / off:.3f} | {r_off * 1000:.0f} / {r_on * 1000:.0f} ms "
            f"| {sig * 1000:.1f} ms ({100 * extra / off:.2f} % with the record's extra) "
            f"| {c['signals_row_bytes']:.0f} ({per_token:.1f}) "
            f"| {c['token_bytes_row_bytes']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an external PostgreSQL (SQLAlchemy URL); default: a fresh embedded server")
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--groups", type=int, default=4, help="groups per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--length", type=int, default=128, help="mean response length (tokens)")
    ap.add_argument("--micro", type=int, default=8, help="learner.micro_batch_size")
    ap.add_argument("--pairs", type=int, default=4, help="timed steps with and without, each")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out")
    ap.add_argument("--report", metavar="JSON", help="print the table of a results file and exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(RESULT_MARK + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if args.report:
        print(markdown(json.loads(Path(args.report).read_text())))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="reflexdb-signals-bench-"))
    try:
        with scratch_database(args.url, f"reflexdb_signals_bench_{os.getpid()}", tmp) as url:
            results = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       "machine": {**host_facts(), "cores": os.cpu_count()}, "loadavg_start": os.getloadavg(),
                       "args": {k: v for k, v in vars(args).items() if k not in ("url", "child")}, "configs": []}
            try:
                for model in args.models.split(","):
                    spec = {"name": f"signals-{model}", "model": model, "url": url, "groups": args.groups,
                            "group_size": args.group_size, "length": args.length, "micro": args.micro,
                            "pairs": args.pairs, "threads": args.threads, "seed": args.seed}
                    log(f"--- {model} (load average {os.getloadavg()[0]:.2f})")
                    results["configs"].append(run_child(spec, tmp / f"home-{model}"))
                    if args.json_out:
                        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
            finally:
                results["loadavg_end"] = os.getloadavg()
                if args.json_out:
                    Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if results["configs"]:
        print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
