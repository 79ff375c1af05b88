"""Many writers: N collector processes against one PostgreSQL while a learner samples.

For each N in ``--writers`` (default 1, 2, 4, 8, 16, 32) the script starts, in a fresh database:

- N collector **processes** running the product's own loop (``collector/runner.py``
  ``Collector.run``: task claims with ``FOR UPDATE SKIP LOCKED``, admission control, reload
  checks, the ``multi_attempt`` environment and rollout driver, ``Store.write_groups`` with the
  claim completed in the same transaction, heartbeats, shutdown) over a **synthetic engine**
  registered as ``synthetic`` in the engine registry: no model; it returns canned token ids,
  float32 log-probs and 576-d float32 hidden-state embeddings (SmolLM2-135M's size) at once, with
  prompts of 40-120 tokens and responses of 50-600 tokens (log-normal, median 200). It answers
  right with probability ``--p-correct``; a wrong answer gets the environment's feedback and
  another turn (up to ``--max-attempts``), so some episodes are multi-turn. Groups of 8.
- one **learner** process that does what a learner step reads, every ``--learner-interval``
  seconds: the learner's choice query (``trainer.batch.eligible_group_ids``, 64 groups) and
  ``Store.read_groups(ids, turns=False)`` (payloads included) for 64 groups drawn at random from
  those written so far.

After ``--warmup`` seconds it measures for ``--seconds``: groups/s and MB/s written, the latency of
each ``write_groups`` call and of each claim, groups per collector (min, max, Jain's fairness
index), errors, the learner's sample latency, and the CPU time of the server's processes, of the
collectors and of the learner (``/proc/<pid>/stat``), hence the server CPU per group that caps
throughput: groups/s <= cores / server CPU per group.

    python benchmarks/scale_bench.py --quick                          # 1, 2, 4 writers, 5 s each
    python benchmarks/scale_bench.py --seconds 20 --json-out scale.json   # the sweep in docs/benchmarks.md
    python benchmarks/scale_bench.py --url postgresql://...           # an external server (needs CREATEDB)
    python benchmarks/scale_bench.py --report scale.json              # the markdown of a run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import store_bench as sb  # noqa: E402  (helpers: log, pct, server_cpu, machine_info, parse_or_report, _with_database)

from reflexdb.db import libpq_url  # noqa: E402

VOCAB = 49152  # SmolLM2's vocabulary
HIDDEN = 576  # SmolLM2-135M's hidden size: the embedding the real engine stores
GROUP_SIZE = 8
ENGINE = "synthetic"
REWARD = "scale_bench"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------- synthetic engine


_WORDS = ("so we add the two numbers first then carry one and check the digit sum again which gives "
          "a total that we verify step by step before writing the final result out").split()
_TEXT = " ".join(_WORDS[i % len(_WORDS)] for i in range(4000))  # ~20k characters to slice responses from


class SyntheticEngine:
    """An :class:`~reflexdb.collector.engines.Engine` with no model: canned samples of realistic shape.

    Args:
        model: a directory with a Hugging Face tokenizer (SmolLM2's): the rollout driver renders
            the environment's feedback turns with its chat template, as with a real engine.
        prompt_tokens: turn 0's prompt length is drawn uniformly from this range (inclusive); a
            later turn's prompt is the token ids the driver passes.
        response_median, response_sigma: response lengths are log-normal with this median and
            sigma, clipped to ``[50, max_new_tokens]`` (``finish_reason`` ``length`` at the cap).
        p_correct: probability that a response ends "The answer is 1." (right, under the
            ``scale_bench`` reward) rather than "The answer is 0.".
    """

    kind = ENGINE

    def __init__(self, model: str | Path, device: str = "cpu", *, prompt_tokens: tuple[int, int] = (40, 120),
                 response_median: float = 200.0, response_sigma: float = 0.6, p_correct: float = 0.6):
        self._dir = Path(model)
        self._tok = None
        self.prompt_tokens, self.p_correct = prompt_tokens, p_correct
        self.response_median, self.response_sigma = response_median, response_sigma
        self.rng = np.random.default_rng()

    @property
    def model_name(self) -> str:
        return self._dir.name

    @property
    def hidden_size(self) -> int:
        return HIDDEN

    @property
    def tokenizer(self):
        if self._tok is None:
            from transformers import PreTrainedTokenizerFast

            self._tok = PreTrainedTokenizerFast.from_pretrained(self._dir)
        return self._tok

    def generate(self, prompts, n=1, params=None):
        from reflexdb.collector.engines import Sample, SamplingParams

        params = params or SamplingParams()
        rng = np.random.default_rng(params.seed) if params.seed is not None else self.rng
        out = []
        for p in prompts:
            if isinstance(p, str) or (len(p) and isinstance(p[0], Mapping)):  # turn 0: text or chat messages
                lo, hi = self.prompt_tokens
                prompt_ids = rng.integers(0, VOCAB, int(rng.integers(lo, hi + 1)), dtype=np.int32)
            else:  # a later turn: the conversation so far, as token ids
                prompt_ids = np.asarray(p, dtype=np.int32)
            row = []
            for _ in range(n):
                cap = params.max_new_tokens
                T = int(min(cap, max(50, round(rng.lognormal(np.log(self.response_median), self.response_sigma)))))
                start = int(rng.integers(0, len(_TEXT) - 4 * T - 1))
                answer = "1" if rng.random() < self.p_correct else "0"
                row.append(Sample(
                    prompt_ids=prompt_ids,
                    token_ids=rng.integers(0, VOCAB, T, dtype=np.int32),
                    logprobs=(-rng.exponential(0.4, T)).astype(np.float32),
                    finish_reason="length" if T >= cap else "stop",
                    text=f"{_TEXT[start:start + 4 * T - 20]} The answer is {answer}.",
                    embedding=rng.standard_normal(HIDDEN).astype(np.float32),
                ))
            out.append(row)
        return out

    def score(self, prompt_ids, response_ids, *, temperature=1.0):
        from reflexdb.collector.engines import ScoreResult

        return [ScoreResult((-self.rng.exponential(0.4, len(r))).astype(np.float32),
                            self.rng.standard_normal(HIDDEN).astype(np.float32)) for r in response_ids]

    def load_weights(self, path) -> None:
        pass

    def close(self) -> None:
        pass


def _reward(response: str, ground_truth: str | None):
    """The synthetic engine's verdict: its last word is 1 (right) or 0 (wrong)."""
    from reflexdb.collector.rewards import RewardResult

    answer = response.rstrip(".").rsplit(" ", 1)[-1]
    return RewardResult(reward=float(answer == "1"), correct=answer == "1", extracted=answer)


def register() -> None:
    """Register the ``synthetic`` engine and the ``scale_bench`` reward (in every process)."""
    from reflexdb.collector.engines import register_engine
    from reflexdb.collector.rewards import register_reward

    register_engine(ENGINE, SyntheticEngine, replace=True)
    register_reward(REWARD, _reward, replace=True)


def run_config(args, run: str, model_dir: Path, name: str | None = None) -> dict:
    """The collectors' run config (a dict for ``reflexdb.config.parse_config``)."""
    return {
        "run": run,
        "model": str(model_dir),  # the tokenizer directory: resolve_model takes an existing directory as is
        # Admission control stays open: no learner publishes here, and a learner that keeps up
        # never holds collectors back either. The admission query still runs every iteration.
        "learner": {"groups_per_step": 100_000, "publish_every": 100_000},
        "tasks": {"train_size": args.tasks, "eval_size": 0, "level": 3},
        "environment": {"name": "multi_attempt", "max_attempts": args.max_attempts},
        "collector": {"name": name, "group_size": GROUP_SIZE, "tasks_per_batch": 1, "reward": REWARD,
                      "sampling": {"max_new_tokens": 600}},
    }


# ---------------------------------------------------------------------------------------------- child processes


def _shape(groups) -> tuple[int, int, int, int, int, int]:
    """(trajectories, prompt tokens, response tokens, assistant turns, multi-turn trajectories,
    data bytes) of groups handed to ``write_groups``; bytes: arrays as handed over plus turn texts."""
    n = p = r = turns = multi = nbytes = 0
    for g in groups:
        for t in g.trajectories:
            n += 1
            p += len(t.prompt_ids)
            r += len(t.response_ids)
            a = sum(u.role == "assistant" for u in t.turns)
            turns += a
            multi += a > 1
            for arr in (t.prompt_ids, t.response_ids, t.logprobs, getattr(t, "token_policy_versions", None),
                        t.embedding):
                nbytes += np.asarray(arr).nbytes if arr is not None else 0
            nbytes += sum(len(u.text.encode()) for u in t.turns)
    return n, p, r, turns, multi, nbytes


@contextlib.contextmanager
def _worker(role: str, rec: dict, out_path: str):
    """What a worker process (collector or learner) does around its body, which appends the stores
    it opens to the list this yields: an exception is counted in ``rec["errors"]`` under ``role``,
    with its traceback; then the stores are closed, ``rec`` goes to ``out_path`` as JSON, and the
    process exits, 1 after an exception."""
    stores: list = []
    code = 0
    try:
        yield stores
    except BaseException as exc:
        rec["errors"][f"{role} {type(exc).__name__}"] += 1
        rec["traceback"] = traceback.format_exc()
        code = 1
    finally:
        for store in stores:
            store.close()
        Path(out_path).write_text(json.dumps(rec))
    sys.exit(code)


def _collector_main(url: str, cfg_data: dict, engine_kw: dict, out_path: str, barrier, stop, max_seconds: float):
    """One collector process: the real ``Collector`` over the synthetic engine, its writes and
    claims timed; what it measured goes to ``out_path`` as JSON."""
    rec: dict = {"pid": os.getpid(), "name": cfg_data["collector"]["name"], "writes": [], "claims": [], "engine": [],
                 "errors": Counter(), "echo": [], "groups_total": 0}
    with _worker("collector", rec, out_path) as stores:
        register()
        from reflexdb import Store
        from reflexdb.collector.engines import make_engine
        from reflexdb.collector.runner import Collector
        from reflexdb.config import parse_config
        from reflexdb.db import name_process

        cfg = parse_config(cfg_data)
        name_process("collect", cfg.run)
        store = Store.open(url)
        stores.append(store)
        write = store.write_groups

        def timed_write(groups, **kw):
            t0 = time.monotonic()
            try:
                out = write(groups, **kw)
            except Exception as exc:  # counted, then the loop's own handling (retry, ClaimLost) runs
                rec["errors"][f"write {type(exc).__name__}"] += 1
                raise
            t1 = time.monotonic()
            rec["writes"].append((t1, t1 - t0, len(groups), *_shape(groups)))
            rec["groups_total"] += len(groups)
            return out

        store.write_groups = timed_write
        engine = make_engine(ENGINE, model=cfg.model, **engine_kw)
        engine.tokenizer  # loaded now, not in the measured loop (the driver renders feedback turns with it)
        generate = engine.generate

        def timed_generate(*a, **kw):  # the synthetic engine's own CPU, to tell it from the collector's
            c0 = time.thread_time()
            out = generate(*a, **kw)
            rec["engine"].append((time.monotonic(), time.thread_time() - c0))
            return out

        engine.generate = timed_generate
        c = Collector(cfg, store, engine, echo=rec["echo"].append)
        for w in c.workflows:
            w.claim = _timed_claim(w.claim, rec)
        c.setup()
        barrier.wait(timeout=max_seconds)
        threading.Thread(target=lambda: (stop.wait(max_seconds), setattr(c, "stopping", True)), daemon=True).start()
        c.run(max_seconds=max_seconds)


def _timed_claim(claim, rec):
    def timed(want):
        t0 = time.monotonic()
        try:
            got = claim(want)
        except Exception as exc:
            rec["errors"][f"claim {type(exc).__name__}"] += 1
            raise
        t1 = time.monotonic()
        rec["claims"].append((t1, t1 - t0, len(got)))
        return got

    return timed


def _learner_main(url: str, run: str, out_path: str, barrier, stop, interval: float, batch: int, max_seconds: float):
    """What a learner step reads, every ``interval`` seconds: the learner's choice of ``batch``
    eligible groups, then ``read_groups`` (payloads, no turns) of ``batch`` random written groups."""
    rec: dict = {"pid": os.getpid(), "samples": [], "errors": Counter()}
    with _worker("learner", rec, out_path) as stores:
        from reflexdb import Store
        from reflexdb.db import name_process
        from reflexdb.trainer.batch import eligible_group_ids

        name_process("learn", run)
        store = Store.open(url)
        stores.append(store)
        run_id = store.run_id(run)
        rng = np.random.default_rng(0)
        known: list[int] = []
        barrier.wait(timeout=max_seconds)
        deadline = time.monotonic() + max_seconds
        while not stop.is_set() and time.monotonic() < deadline:
            start = time.monotonic()
            with store.transaction() as conn:  # the ids written so far (not timed)
                known += [r[0] for r in conn.execute("SELECT id FROM groups WHERE run_id = %s AND id > %s ORDER BY id",
                                                     (run_id, known[-1] if known else 0)).fetchall()]
            if len(known) >= batch:
                try:
                    t0 = time.monotonic()
                    eligible_group_ids(store, run_id, batch, min_version=-1)  # version 0, max_staleness 1
                    t1 = time.monotonic()
                    ids = rng.choice(known, batch, replace=False).tolist()
                    groups = store.read_groups(ids, turns=False)
                    t2 = time.monotonic()
                    nbytes = sum(t.response_ids.nbytes + t.prompt_ids.nbytes + t.logprobs.nbytes
                                 for g in groups for t in g.trajectories)
                    rec["samples"].append((t2, t1 - t0, t2 - t1, sum(len(g.trajectories) for g in groups), nbytes))
                except Exception as exc:
                    rec["errors"][f"learner {type(exc).__name__}"] += 1
            stop.wait(max(0.0, interval - (time.monotonic() - start)))


# ---------------------------------------------------------------------------------------------- one N


def proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid``, all its threads, exited ones included
    (``/proc/PID/stat``; the read path fetches half the payloads in a helper thread)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, ValueError, IndexError):
        return None


def machine_busy() -> float:
    """CPU seconds all CPUs of the machine have spent busy since boot (``/proc/stat``: everything
    but idle and iowait): with the processes' own CPU, what other processes took meanwhile."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / _CLK_TCK  # user nice system idle iowait irq softirq steal


def _wal_lsn(url: str) -> int:
    with psycopg.connect(libpq_url(url)) as c:
        return int(c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()[0])


def _stats_ms(values: list[float]) -> dict:
    if not values:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    ms = [v * 1000 for v in values]
    return {"count": len(ms), "p50": round(sb.pct(ms, 50), 2), "p99": round(sb.pct(ms, 99), 2), "max": round(max(ms), 2)}


def _sleep_until(t: float) -> None:
    while (left := t - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


def run_writers(n: int, server_url: str, template: str, model_dir: Path, work: Path, args) -> dict:
    """Run N collectors and the learner in a fresh database; measure the window; check the data."""
    from reflexdb import Store
    from reflexdb.collector.sources import build_tasks
    from reflexdb.config import parse_config

    db = f"reflexdb_scale_{os.getpid()}_{n}"
    admin = libpq_url(sb._with_database(server_url, "postgres"))
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{db}"')
        c.execute(f'CREATE DATABASE "{db}" TEMPLATE "{template}"')
    url = sb._with_database(server_url, db)
    run = "scale-bench"
    try:
        # The run and its tasks exist before the collectors start (their setup finds them), as in a
        # deployment that collectors join.
        cfg = parse_config(run_config(args, run, model_dir))
        store = Store.open(url)
        store.create_run(cfg.run, algorithm=cfg.algorithm, config=cfg.masked())
        store.add_tasks(store.run_id(run), build_tasks(cfg.tasks)[0])
        store.close()
        return _measure(n, url, run, model_dir, work, args)
    finally:
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def _measure(n: int, url: str, run: str, model_dir: Path, work: Path, args) -> dict:
    ctx = mp.get_context("spawn")
    barrier, stop = ctx.Barrier(n + 2), ctx.Event()
    setup_s = 60.0 + 6.0 * n  # imports and setup on a loaded 2-core machine: ~3 CPU-seconds a process
    bound = setup_s + args.warmup + args.seconds + 60.0  # every child stops by itself after this
    engine_kw = {"p_correct": args.p_correct}
    outs, procs = [], []
    for i in range(n):
        out = work / f"w{n}-c{i}.json"
        outs.append(out)
        procs.append(ctx.Process(target=_collector_main, name=f"collector-{i}", args=(
            url, run_config(args, run, model_dir, name=f"c{i:02d}"), engine_kw, str(out), barrier, stop, bound)))
    learner_out = work / f"w{n}-learner.json"
    procs.append(ctx.Process(target=_learner_main, name="learner", args=(
        url, run, str(learner_out), barrier, stop, args.learner_interval, args.batch_groups, bound)))
    load_start = os.getloadavg()
    t_spawn = time.monotonic()
    for p in procs:
        p.start()
    errors: Counter = Counter()
    try:
        barrier.wait(timeout=setup_s)
    except threading.BrokenBarrierError:
        errors["setup did not finish"] += 1
        stop.set()
        barrier.abort()
    ready = time.monotonic()
    sb.log(f"{n} writers: {n} collectors and the learner ready in {ready - t_spawn:.1f} s")
    # Warm-up: --warmup seconds, and until every collector has written a group and the learner
    # has enough groups to sample (processes' first iterations compile and cache things).
    _sleep_until(ready + args.warmup)
    warm_by = time.monotonic() + 60 + 2 * n
    with psycopg.connect(libpq_url(url), autocommit=True) as c:
        while True:
            writers_seen, stored = c.execute("SELECT count(DISTINCT collector), count(*) FROM groups").fetchone()
            if (writers_seen >= n and stored >= args.batch_groups) or errors:
                break
            if time.monotonic() > warm_by:
                errors["warm-up: not every collector wrote a group"] += 1
                break
            time.sleep(0.2)
    t0 = time.monotonic()
    pids = {p.name: p.pid for p in procs}
    cpu0 = {k: proc_cpu(pid) for k, pid in pids.items()}
    srv0, wal0, busy0, t0 = sb.server_cpu(), _wal_lsn(url), machine_busy(), time.monotonic()
    sb.log(f"{n} writers: measuring {args.seconds:g} s after {t0 - ready:.1f} s of warm-up")
    _sleep_until(t0 + args.seconds)
    cpu1 = {k: proc_cpu(pid) for k, pid in pids.items()}
    srv1, wal1, busy1, t1 = sb.server_cpu(), _wal_lsn(url), machine_busy(), time.monotonic()
    load_end = os.getloadavg()
    stop.set()
    deadline = time.monotonic() + 60 + n
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
        if p.is_alive():
            errors[f"{p.name} did not stop"] += 1
            p.kill()
            p.join(timeout=10)
        elif p.exitcode != 0:
            errors[f"{p.name} exit {p.exitcode}"] += 1

    recs = []
    for out in outs:
        if out.exists():
            recs.append(json.loads(out.read_text()))
        else:
            errors["collector left no result"] += 1
    learner = json.loads(learner_out.read_text()) if learner_out.exists() else {"samples": [], "errors": {}}
    for r in [*recs, learner]:
        errors.update(r["errors"])
        if "traceback" in r:
            sb.log(f"{r.get('name', 'learner')} failed:\n{r['traceback']}")

    # Everything the collectors said they wrote is in the database, whole, and no claim is left.
    with psycopg.connect(libpq_url(url)) as c:
        stored, incomplete, claims_left, not_stopped = c.execute("""
            SELECT (SELECT count(*) FROM groups),
                   (SELECT count(*) FROM (
                       SELECT g.size, count(t.id) AS n, count(p.trajectory_id) AS np
                       FROM groups g LEFT JOIN trajectories t ON t.group_id = g.id
                                     LEFT JOIN token_payloads p ON p.trajectory_id = t.id
                       GROUP BY g.id, g.size) x WHERE n <> size OR np <> size),
                   (SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL),
                   (SELECT count(*) FROM collectors WHERE status <> 'stopped')""").fetchone()
    if stored != sum(r["groups_total"] for r in recs):
        errors["groups stored <> groups written"] += 1
    for label, k in (("incomplete groups", incomplete), ("claims left after stop", claims_left),
                     ("collectors not marked stopped", not_stopped)):
        if k:
            errors[label] += k

    secs = t1 - t0
    inside = lambda t: t0 <= t <= t1  # noqa: E731
    writes = [w for r in recs for w in r["writes"] if inside(w[0])]
    per_collector = [sum(w[2] for w in r["writes"] if inside(w[0])) for r in recs]
    groups = sum(w[2] for w in writes)
    cols = np.array([w[3:] for w in writes], dtype=float).reshape(-1, 6).sum(axis=0)
    trajs, ptok, rtok, turns, multi, nbytes = cols.tolist()
    claims = [c for r in recs for c in r["claims"] if inside(c[0])]
    samples = [s for s in learner["samples"] if inside(s[0])]
    x = np.asarray(per_collector, dtype=float)
    jain = float(x.sum() ** 2 / (len(x) * (x**2).sum())) if len(x) and x.any() else None

    def cpu(names) -> float | None:
        d = [cpu1[k] - cpu0[k] for k in names if cpu0.get(k) is not None and cpu1.get(k) is not None]
        return sum(d) if len(d) == len(names) else None

    coll_cpu = cpu([f"collector-{i}" for i in range(n)])
    engine_cpu = sum(e[1] for r in recs for e in r["engine"] if inside(e[0]))
    learn_cpu = cpu(["learner"])
    srv_cpu = srv1 - srv0 if srv0 is not None and srv1 is not None else None
    per_group = lambda s: round(s * 1000 / groups, 2) if s is not None and groups else None  # noqa: E731
    cores = os.cpu_count() or 1
    result = {
        "writers": n,
        "seconds": round(secs, 2),
        "setup_s": round(ready - t_spawn, 1),
        "warmup_s": round(t0 - ready, 1),
        "groups": groups,
        "groups_per_s": round(groups / secs, 1),
        "trajectories_per_s": round(trajs / secs, 1),
        "response_tokens_per_s": round(rtok / secs),
        "mb_per_s": round(nbytes / secs / 1e6, 2),
        "wal_mb_per_s": round((wal1 - wal0) / secs / 1e6, 2),
        "write_ms": _stats_ms([w[1] for w in writes]),
        "claim_ms": _stats_ms([c[1] for c in claims]),
        "empty_claims": sum(1 for c in claims if c[2] == 0),
        "groups_per_collector": per_collector,
        "fairness": {"min": int(x.min()) if len(x) else None, "max": int(x.max()) if len(x) else None,
                     "jain": None if jain is None else round(jain, 4)},
        "learner": {"samples": len(samples), "read_ms": _stats_ms([s[2] for s in samples]),
                    "choose_ms": _stats_ms([s[1] for s in samples]),
                    "reads": [[round(s[0] - t0, 2), round(s[2] * 1000, 1)] for s in samples],  # [s into window, ms]
                    "trajectories_per_sample": round(float(np.mean([s[3] for s in samples])), 1) if samples else None,
                    "payload_mb_per_sample": round(float(np.mean([s[4] for s in samples])) / 1e6, 2) if samples else None},
        "cpu": {
            "server_s": None if srv_cpu is None else round(srv_cpu, 2),
            "collectors_s": None if coll_cpu is None else round(coll_cpu, 2),
            "learner_s": None if learn_cpu is None else round(learn_cpu, 2),
            "server_cores": None if srv_cpu is None else round(srv_cpu / secs, 2),
            "collectors_cores": None if coll_cpu is None else round(coll_cpu / secs, 2),
            "learner_cores": None if learn_cpu is None else round(learn_cpu / secs, 2),
            "machine_busy_cores": round((busy1 - busy0) / secs, 2),
            # every CPU-second of the window not spent by this benchmark's processes (other
            # sessions on a shared machine, the kernel, this coordinating process)
            "other_cores": (round((busy1 - busy0 - srv_cpu - coll_cpu - (learn_cpu or 0)) / secs, 2)
                            if srv_cpu is not None and coll_cpu is not None else None),
            "server_ms_per_group": per_group(srv_cpu),
            "collectors_ms_per_group": per_group(coll_cpu),
            "synthetic_engine_ms_per_group": per_group(engine_cpu),  # part of collectors_ms_per_group
            "server_ceiling_groups_per_s": round(cores / (srv_cpu / groups)) if srv_cpu and groups else None,
            "machine_ceiling_groups_per_s": (round(cores / ((srv_cpu + coll_cpu + (learn_cpu or 0)) / groups))
                                             if srv_cpu and coll_cpu and groups else None),
        },
        "shapes": {
            "prompt_tokens_mean": round(ptok / trajs, 1) if trajs else None,
            "response_tokens_mean": round(rtok / trajs, 1) if trajs else None,
            "assistant_turns_mean": round(turns / trajs, 2) if trajs else None,
            "multi_turn_fraction": round(multi / trajs, 3) if trajs else None,
            "kib_per_trajectory": round(nbytes / trajs / 1024, 2) if trajs else None,
        },
        "stored_groups": stored,
        "errors": dict(errors),
        "errors_total": sum(errors.values()),
        "loadavg_start": load_start,
        "loadavg_end": load_end,
    }
    sb.log(f"{n} writers: {result['groups_per_s']} groups/s, {result['mb_per_s']} MB/s, write p50/p99 "
           f"{result['write_ms']['p50']}/{result['write_ms']['p99']} ms, Jain {result['fairness']['jain']}, "
           f"learner read p50/p99 {result['learner']['read_ms']['p50']}/{result['learner']['read_ms']['p99']} ms, "
           f"server CPU {result['cpu']['server_ms_per_group']} ms/group, errors {result['errors_total']}"
           + (f" {dict(errors)}" if errors else ""))
    return result


# ---------------------------------------------------------------------------------------------- report


def _f(v, fmt="{:,}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(results: dict) -> str:
    """The tables of docs/benchmarks.md from a results dict (``--report results.json``)."""
    m = results["machine"]
    out = [f"Run {results['date']}: `{results['command']}`; {m.get('cpus')} CPUs ({m.get('cpu', '?')}), "
           f"{m.get('mem_gib')} GiB RAM, PostgreSQL {m.get('postgres')} (shared_buffers {m.get('pg_shared_buffers')}), "
           f"load average at start {m['loadavg_start'][0]:.2f}, at end {results['loadavg_end'][0]:.2f}; "
           f"{results['args']['seconds']:g} s measured per N, after a warm-up of at least {results['args']['warmup']:g} s "
           "that lasts until every collector has written a group.\n"]
    out.append("| writers | groups/s | MB/s | write p50 / p99 ms | groups per collector min–max | Jain | "
               "learner read p50 / p99 ms | server CPU (cores) | collectors CPU (cores) | server CPU ms/group | "
               "collector CPU ms/group | server ceiling groups/s | errors |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results["runs"]:
        c, w, lr, f = r["cpu"], r["write_ms"], r["learner"]["read_ms"], r["fairness"]
        out.append(f"| {r['writers']} | {r['groups_per_s']:,} | {r['mb_per_s']} | {_f(w['p50'])} / {_f(w['p99'])} | "
                   f"{_f(f['min'])}–{_f(f['max'])} | {_f(f['jain'], '{:.3f}')} | {_f(lr['p50'])} / {_f(lr['p99'])} | "
                   f"{_f(c['server_cores'])} | {_f(c['collectors_cores'])} | {_f(c['server_ms_per_group'])} | "
                   f"{_f(c['collectors_ms_per_group'])} | {_f(c['server_ceiling_groups_per_s'])} | {r['errors_total']} |")
    out.append("")
    out.append("| writers | trajectories/s | response tokens/s | WAL MB/s | claim p50 / p99 ms | learner samples | "
               "learner choose p50 / p99 ms | learner CPU (cores) | of collector CPU: synthetic engine ms/group | "
               "all-CPU ceiling groups/s | machine busy (cores) | other processes (cores) | load avg (1 min) start → end |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results["runs"]:
        c, cl, lc = r["cpu"], r["claim_ms"], r["learner"]["choose_ms"]
        out.append(f"| {r['writers']} | {r['trajectories_per_s']:,} | {r['response_tokens_per_s']:,} | "
                   f"{r['wal_mb_per_s']} | {_f(cl['p50'])} / {_f(cl['p99'])} | {r['learner']['samples']} | "
                   f"{_f(lc['p50'])} / {_f(lc['p99'])} | {_f(c['learner_cores'])} | "
                   f"{_f(c.get('synthetic_engine_ms_per_group'))} | "
                   f"{_f(c['machine_ceiling_groups_per_s'])} | {_f(c.get('machine_busy_cores'))} | "
                   f"{_f(c.get('other_cores'))} | {r['loadavg_start'][0]:.2f} → {r['loadavg_end'][0]:.2f} |")
    out.append("")
    s = [r["shapes"] for r in results["runs"] if r["shapes"]["response_tokens_mean"] is not None]
    if s:
        out.append("Shapes written (mean over the runs' measured windows): prompt "
                   f"{np.mean([x['prompt_tokens_mean'] for x in s]):.0f} tokens, response "
                   f"{np.mean([x['response_tokens_mean'] for x in s]):.0f} tokens, "
                   f"{np.mean([x['assistant_turns_mean'] for x in s]):.2f} assistant turns per trajectory "
                   f"({100 * np.mean([x['multi_turn_fraction'] for x in s]):.0f}% multi-turn), "
                   f"{np.mean([x['kib_per_trajectory'] for x in s]):.1f} KiB of arrays and text per trajectory.\n")
    errs = {r["writers"]: r["errors"] for r in results["runs"] if r["errors"]}
    if errs:
        out.append(f"Errors: {errs}\n")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- main


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"load average: {os.getloadavg()}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an external PostgreSQL (SQLAlchemy URL; the role needs CREATEDB); "
                    "default: a fresh embedded server in a temporary directory")
    ap.add_argument("--writers", default="1,2,4,8,16,32", help="collector process counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per N")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after every process is ready, not measured")
    ap.add_argument("--tasks", type=int, default=1024, help="arithmetic tasks in the run (claimed in turn, forever)")
    ap.add_argument("--max-attempts", type=int, default=3, help="multi_attempt environment: most turns per episode")
    ap.add_argument("--p-correct", type=float, default=0.6, help="synthetic engine: probability of a right answer")
    ap.add_argument("--batch-groups", type=int, default=64, help="groups per learner sample")
    ap.add_argument("--learner-interval", type=float, default=0.5, help="seconds between learner samples")
    ap.add_argument("--keep", action="store_true", help="keep the databases (and the embedded server's directory)")
    ap.add_argument("--quick", action="store_true", help="1, 2 and 4 writers, 5 s each after 2 s of warm-up")
    args = sb.parse_or_report(ap, argv, markdown)
    if args is None:
        return 0
    if args.quick:
        args.writers, args.seconds, args.warmup = "1,2,4", 5.0, 2.0
    writers = [int(w) for w in str(args.writers).split(",") if w]
    register()

    from reflexdb import migrate
    from reflexdb.models import smollm2_tokenizer_dir
    from reflexdb.db import make_engine

    work = Path(tempfile.mkdtemp(prefix="reflexdb-scale-"))
    pgdata = None
    if args.url:
        server_url = args.url
    else:
        from reflexdb import embedded

        pgdata = (work / "pgdata").resolve()
        server_url = embedded.server_uri(pgdata)
        sb._PGDATA = pgdata  # server_cpu() sums the CPU of this server's processes
    # The synthetic engine's "model": SmolLM2's tokenizer (its chat template renders feedback turns),
    # copied under a name that says what wrote the rows (collectors.model, embeddings.model).
    model_dir = work / f"synthetic-{HIDDEN}d"
    shutil.copytree(smollm2_tokenizer_dir(), model_dir, ignore=shutil.ignore_patterns("reflexdb-model.json"))
    template = f"reflexdb_scale_tpl_{os.getpid()}"
    admin = libpq_url(sb._with_database(server_url, "postgres"))
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{template}"')
        c.execute(f'CREATE DATABASE "{template}"')
    engine = make_engine(sb._with_database(server_url, template))
    migrate.upgrade(engine)
    engine.dispose()
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else f"scale_bench.main({argv})",
        "machine": sb.machine_info(server_url),
        "uptime_start": _uptime(),
        "args": {k: v for k, v in vars(args).items() if k != "url"} | {"writers": writers},
        "runs": [],
    }
    sb.log(f"server {'external' if args.url else pgdata}; {results['uptime_start']}")
    try:
        for n in writers:
            results["runs"].append(run_writers(n, server_url, template, model_dir, work, args))
    finally:
        results["loadavg_end"] = os.getloadavg()
        results["uptime_end"] = _uptime()
        results["errors_total"] = sum(r["errors_total"] for r in results["runs"])
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
        if pgdata is not None:
            from reflexdb import embedded

            embedded.stop(pgdata)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
        if results["runs"]:
            print(markdown(results))
    return 1 if results["errors_total"] else 0


if __name__ == "__main__":
    sys.exit(main())
