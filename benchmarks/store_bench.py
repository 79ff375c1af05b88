"""Benchmarks of the experience store: ingest, group sampling, FAISS restricted search.

One script, one run, one server. By default it starts a fresh embedded PostgreSQL in a temporary
directory (``reflexdb.embedded.server_uri``) and migrates it; ``--url`` uses an external server
instead (the benchmark creates and drops its own database there).

Sections (``--sections``, default all three):

1. ``ingest``: full trajectories (300 response tokens + float32 logprobs, ~40 prompt tokens, a
   576-d float32 vector, ~1.2 KB of text in a user and an assistant turn), groups of 8, written
   three ways from the same pre-generated data:

   a. ``Store.write_group``, one group per transaction, with ``synchronous_commit`` off (the
      Store default) and on;
   b. raw binary COPY of the same rows into the same tables, ids pre-allocated, one transaction
      per batch of groups (the ceiling);
   c. the pattern of existing SQL replay buffers: one SQLAlchemy ORM object per trajectory
      (scalar columns + a pickled blob of arrays and turns), one commit per group, in a table
      ``orm_trajectories`` that this benchmark creates itself.

   Each method writes every pre-generated group once per round; rounds are interleaved and the
   median round is reported.

2. ``sample``: load a run to each size in ``--sample-sizes`` (raw COPY; not measured), VACUUM
   ANALYZE, then time ``--samples`` samples of choosing ``--batch-groups`` random group ids of
   the run and ``Store.read_groups(ids, payloads=True)``; report p50/p99.

3. ``faiss``: ``reflexdb.index.EmbeddingIndex`` over the run's vectors (built with
   ``catch_up()``, timed), then ``search(query, k, restrict_to=ids)`` with ~50 ids, ~5000 ids
   and unrestricted; report p50/p99. Skipped with a note when ``reflexdb/index.py`` is missing.

Quick mode (about a minute)::

    python benchmarks/store_bench.py --quick

Full run (the numbers in docs/benchmarks.md)::

    python benchmarks/store_bench.py --json-out benchmarks/results.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import BigInteger, Boolean, Float, Integer, LargeBinary, SmallInteger, Text, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from reflexdb import GroupIn, Store, TaskIn, TrajectoryIn, TurnIn, migrate
from reflexdb.db import connect_raw, libpq_url, make_engine
from reflexdb.store import (
    _EMBED_COLUMNS,
    _EMBED_TYPES,
    _PAYLOAD_COLUMNS,
    _PAYLOAD_DTYPES,
    _PAYLOAD_TYPES,
    _TRAJ_COLUMNS,
    _TRAJ_TYPES,
    _TURN_COLUMNS,
    _TURN_TYPES,
    _payload_cursor,
    copy_rows,
    payload_arrays,
    payload_bytes,
)
from reflexdb.validate import prepare_group

from machine import host_facts, process_cpu
from machine import server_cpu as machine_server_cpu

VOCAB = 49152  # SmolLM2's vocabulary
EMBED_MODEL = "smollm2-135m"
_GROUP_COLUMNS = ("id", "run_id", "task_id", "workflow", "kind", "policy_version", "size", "collector", "meta")
_GROUP_TYPES = ("int8", "int8", "int8", "text", "text", "int4", "int2", "text", "jsonb")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- data


_WORDS = (
    "the answer is so we add carry one two three four five six seven eight nine ten first then "
    "compute sum total step check result digit number plus minus equals therefore final let us "
    "write it out again verify this gives which means that value"
).split()


def _text(rng: np.random.Generator, n_chars: int) -> str:
    words = rng.choice(_WORDS, size=n_chars // 4 + 8)
    s = " ".join(words.tolist())
    return s[:n_chars]


def make_groups(
    n_groups: int, run_id: int, task_ids: list[int], *, group_size: int = 8, T: int = 300, P: int = 40,
    dim: int = 576, seed: int = 0,
) -> list[GroupIn]:
    """Pre-generate ``n_groups`` realistic groups (not timed).

    Token ids are int64 (what a torch/HF tokenizer hands over), logprobs float32, the embedding
    float32. Text is ~200 characters of user turn + ~1000 of assistant turn (~1.2 KB).
    """
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        task = task_ids[g % len(task_ids)]
        prompt = rng.integers(0, VOCAB, P + int(rng.integers(-4, 5)), dtype=np.int64)
        user = _text(rng, 200)
        n_correct = int(rng.integers(0, group_size + 1))
        trajs = []
        for i in range(group_size):
            ok = i < n_correct
            trajs.append(TrajectoryIn(
                prompt_ids=prompt,
                response_ids=rng.integers(0, VOCAB, T, dtype=np.int64),
                logprobs=np.log(rng.uniform(0.05, 1.0, T)).astype(np.float32),
                reward=float(ok),
                correct=ok,
                turns=[TurnIn("user", user), TurnIn("assistant", _text(rng, 1000), 0, T)],
                extracted_answer="5" if ok else "7",
                embedding=rng.standard_normal(dim).astype(np.float32),
            ))
        groups.append(GroupIn(run_id=run_id, task_id=task, policy_version=g // 64, trajectories=trajs,
                              embedding_model=EMBED_MODEL, embedding_layer=-1, collector="bench"))
    return groups


@dataclass
class RawGroup:
    """One group as the tuples the raw COPY path writes (ids filled in per use)."""

    group: tuple  # without id
    trajs: list[tuple]  # without id, group_id
    turns: list[list[tuple]]  # per trajectory, without trajectory_id
    payloads: list[tuple]  # without trajectory_id
    embeds: list[tuple]  # without trajectory_id


def to_raw(g: GroupIn) -> RawGroup:
    """The exact column values the API stores for ``g`` (validation's defaults included)."""
    p = prepare_group(g)
    trajs, turns, payloads, embeds = [], [], [], []
    for i, t in enumerate(p.trajectories):
        s = t.src
        trajs.append((
            g.run_id, g.task_id, i, s.origin, s.parent_trajectory_id,
            t.policy_version, t.reward, s.correct, t.truncated, s.finish_reason, s.extracted_answer,
            t.confidence, max(1, len(t.turns)), t.response_ids.shape[0], s.error, Jsonb(s.meta),
        ))
        turns.append([(k, u.role, u.text, u.token_start, u.token_end, u.trainable, u.tool_error, u.attempt, u.answer,
                       u.correct, u.reward) for k, u in enumerate(t.turns)])
        payloads.append(tuple(payload_bytes(a, d) for a, d in zip(
            (t.prompt_ids, t.response_ids, t.logprobs, t.token_policy_versions, t.loss_mask), _PAYLOAD_DTYPES)))
        embeds.append((g.embedding_model, g.embedding_layer, t.embedding.shape[0], t.embedding))
    group = (g.run_id, g.task_id, g.workflow, g.kind, int(g.policy_version), len(p.trajectories), g.collector,
             Jsonb(g.meta))
    return RawGroup(group, trajs, turns, payloads, embeds)


def fresh_write_keys(groups: list[GroupIn]) -> None:
    """New ``write_key``s, so that writing the same groups again writes them again (not timed)."""
    for g in groups:
        g.write_key = uuid.uuid4()


def allocate_ids(conn: psycopg.Connection, table: str, n: int) -> list[int]:
    """Reserve ``n`` ids of ``table``'s identity sequence (what the API's insert_group does)."""
    rows = conn.execute(
        f"SELECT nextval(pg_get_serial_sequence('{table}', 'id')) FROM generate_series(1, %s)", (n,)
    ).fetchall()
    return [r[0] for r in rows]


def raw_tuples(raws: list[RawGroup], group_ids: list[int], traj_ids: list[int]) -> tuple[list, list, list, list, list]:
    """Row tuples for COPY with ids filled in (traj_ids: group_size per group, in order)."""
    g_rows, t_rows, u_rows, p_rows, e_rows = [], [], [], [], []
    k = 0
    for raw, gid in zip(raws, group_ids):
        g_rows.append((gid, *raw.group))
        for j in range(len(raw.trajs)):
            tid = traj_ids[k]
            k += 1
            t = raw.trajs[j]
            t_rows.append((tid, gid, *t))
            for u in raw.turns[j]:
                u_rows.append((tid, *u, raw.group[0]))  # run_id last: the partition key
            p_rows.append((tid, *raw.payloads[j], raw.group[0]))
            e_rows.append((tid, *raw.embeds[j], raw.group[0]))
    return g_rows, t_rows, u_rows, p_rows, e_rows


def copy_batch(conn: psycopg.Connection, rows: tuple[list, list, list, list, list]) -> None:
    """One transaction: binary COPY of groups, trajectories, turns, token_bytes, embeddings."""
    g_rows, t_rows, u_rows, p_rows, e_rows = rows
    with conn.transaction():
        cur = conn.cursor()
        copy_rows(cur, "groups", _GROUP_COLUMNS, _GROUP_TYPES, g_rows)
        copy_rows(cur, "trajectories", _TRAJ_COLUMNS, _TRAJ_TYPES, t_rows)
        copy_rows(cur, "turns", _TURN_COLUMNS, _TURN_TYPES, u_rows)
        copy_rows(cur, "token_bytes", _PAYLOAD_COLUMNS, _PAYLOAD_TYPES, p_rows)
        copy_rows(cur, "embeddings", _EMBED_COLUMNS, _EMBED_TYPES, e_rows)


# ---------------------------------------------------------------------------------------------- ORM


class OrmBase(DeclarativeBase):
    pass


class OrmTrajectory(OrmBase):
    """How existing SQL replay buffers store experience: scalars + a pickled blob per row."""

    __tablename__ = "orm_trajectories"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(BigInteger)
    task_id: Mapped[int] = mapped_column(BigInteger, index=True)
    group_key: Mapped[int] = mapped_column(BigInteger, index=True)
    index_in_group: Mapped[int] = mapped_column(SmallInteger)
    policy_version: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float)
    correct: Mapped[bool | None] = mapped_column(Boolean)
    finish_reason: Mapped[str] = mapped_column(Text)
    extracted_answer: Mapped[str | None] = mapped_column(Text)
    response_length: Mapped[int] = mapped_column(Integer)
    blob: Mapped[bytes] = mapped_column(LargeBinary)


def orm_write_group(session: Session, g: GroupIn, group_key: int) -> None:
    for i, t in enumerate(g.trajectories):
        blob = pickle.dumps(
            {"prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "logprobs": t.logprobs,
             "embedding": t.embedding, "turns": [(u.role, u.text, u.token_start, u.token_end) for u in t.turns]},
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        session.add(OrmTrajectory(
            run_id=g.run_id, task_id=g.task_id, group_key=group_key, index_in_group=i,
            policy_version=g.policy_version, reward=t.reward, correct=t.correct, finish_reason=t.finish_reason,
            extracted_answer=t.extracted_answer, response_length=len(t.response_ids), blob=blob,
        ))
    session.commit()


# ---------------------------------------------------------------------------------------------- timing helpers


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


_PGDATA: Path | None = None  # the embedded server's data directory, for server_cpu()


def server_cpu() -> float | None:
    """CPU seconds used so far by the embedded server's processes (machine.server_cpu); None for an
    external server."""
    return machine_server_cpu(_PGDATA)


def parse_or_report(ap: argparse.ArgumentParser, argv, markdown) -> argparse.Namespace | None:
    """``ap`` with ``--json-out`` and ``--report`` (this script's and scale_bench.py's) parses
    ``argv``; with ``--report``, ``markdown`` of that results file is printed and None returned."""
    ap.add_argument("--json-out", help="write the results here as JSON")
    ap.add_argument("--report", metavar="JSON", help="print the markdown tables of a results file and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(markdown(json.loads(Path(args.report).read_text())))
        return None
    return args


def _cpu_steps(pid: int, acc: dict[str, list[float]]):
    """``step(name, fn)``: ``fn()``, adding the CPU seconds it took in backend ``pid`` and in this
    process to ``acc[name]`` (``[server, client]``)."""

    def step(name: str, fn):
        s0, c0 = process_cpu(pid), time.process_time()
        out = fn()
        s1, c1 = process_cpu(pid), time.process_time()
        a = acc.setdefault(name, [0.0, 0.0])
        a[0] += s1 - s0
        a[1] += c1 - c0
        return out

    return step


def machine_info(url: str) -> dict:
    info = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            **host_facts()}
    with psycopg.connect(libpq_url(url)) as conn:
        info["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
        for k in ("shared_buffers", "fsync", "wal_level", "max_wal_size"):
            info[f"pg_{k}"] = conn.execute(f"SHOW {k}").fetchone()[0]
    info["psycopg"] = psycopg.__version__
    info["numpy"] = np.__version__
    info["loadavg_start"] = os.getloadavg()
    return info


# ---------------------------------------------------------------------------------------------- section 1


def bench_ingest(server_url: str, args, results: dict) -> None:
    """Section 1, in a database of its own on the same server (created, migrated, dropped)."""
    url = _with_database(server_url, f"reflexdb_bench_ingest_{os.getpid()}")
    admin = libpq_url(_with_database(server_url, "postgres"))
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}"')
        c.execute(f'CREATE DATABASE "{make_url(url).database}"')
    engine = make_engine(url)
    migrate.upgrade(engine)
    try:
        _bench_ingest(url, engine, args, results)
    finally:
        engine.dispose()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


def _with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def _bench_ingest(url: str, engine, args, results: dict) -> None:
    store_off = Store(engine)  # synchronous_commit off (the default)
    store_on = Store(engine, synchronous_commit=True)
    run = store_off.create_run("bench-ingest")
    tasks = store_off.add_tasks(run, [TaskIn(prompt=f"task {i}", dataset="bench") for i in range(256)])

    n = args.ingest_groups
    gsize = 8
    log(f"ingest: generating {n} groups of {gsize} ...")
    groups = make_groups(n, run, tasks, group_size=gsize, seed=1)
    raws = [to_raw(g) for g in groups]
    rows_per_round = n * gsize
    approx_bytes = sum(
        t.response_ids.nbytes // 2 + t.logprobs.nbytes + t.prompt_ids.nbytes // 2 + t.embedding.nbytes
        + 300 * 4 + 300 + sum(len(u.text) for u in t.turns)
        for t in groups[0].trajectories
    ) / gsize
    log(f"ingest: {rows_per_round} rows per method per round, ~{approx_bytes / 1024:.1f} KiB of data per row")

    orm_engine = create_engine(url, pool_size=2)
    OrmBase.metadata.drop_all(orm_engine)
    OrmBase.metadata.create_all(orm_engine)
    raw_conn = connect_raw(url, autocommit=True)

    # warm-up: a few groups each way, so one-time costs (connection, plan caches, embedding dim
    # claim) are not counted
    for g in groups[:4]:
        store_off.write_group(g)
        store_on.write_group(g)
    with Session(orm_engine) as s:
        for g in groups[:4]:
            orm_write_group(s, g, -1)
    with raw_conn.transaction():
        gids, tids = allocate_ids(raw_conn, "groups", 4), allocate_ids(raw_conn, "trajectories", 4 * gsize)
    copy_batch(raw_conn, raw_tuples(raws[:4], gids, tids))

    times: dict[str, list[float]] = {"api_async": [], "api_batch8": [], "api_batch64": [], "raw_copy": [], "orm": [],
                                     "api_sync": [], "orm_async": []}
    cpu: dict[str, list[tuple[float, float | None]]] = {k: [] for k in times}

    def timed(name: str, fn) -> None:
        """Run ``fn`` once; record wall time and client / server CPU seconds per group."""
        fresh_write_keys(groups)  # else the API finds each group already written and writes nothing
        gc.collect()
        s0, c0, t0 = server_cpu(), time.process_time(), time.perf_counter()
        fn()
        wall, c1, s1 = time.perf_counter() - t0, time.process_time(), server_cpu()
        times[name].append(wall)
        cpu[name].append(((c1 - c0) / n, None if s0 is None or s1 is None else (s1 - s0) / n))

    def api(store: Store) -> None:
        for g in groups:
            store.write_group(g)

    def api_batched(store: Store, per: int = 8) -> None:
        # write_groups: several groups per transaction, one COPY per table for all of them (what a
        # collector with tasks_per_batch > 1 does)
        for i in range(0, len(groups), per):
            store.write_groups(groups[i : i + per])

    def orm(engine) -> None:
        nonlocal group_key
        with Session(engine) as s:
            for g in groups:
                orm_write_group(s, g, group_key)
                group_key += 1

    # the ORM with synchronous_commit off too, for a like-for-like durability comparison
    orm_async_engine = create_engine(url, pool_size=2, connect_args={"options": "-c synchronous_commit=off"})
    with Session(orm_async_engine) as s:
        orm_write_group(s, groups[0], -1)
    batch = args.copy_batch_groups
    group_key = 0
    for rnd in range(args.rounds):
        timed("api_async", lambda: api(store_off))  # synchronous_commit off (the Store default)
        timed("api_batch8", lambda: api_batched(store_off))
        timed("api_batch64", lambda: api_batched(store_off, 64))

        # raw COPY: ids and tuples prepared before the clock starts
        with raw_conn.transaction():
            gids = allocate_ids(raw_conn, "groups", n)
            tids = allocate_ids(raw_conn, "trajectories", n * gsize)
        batches = [
            raw_tuples(raws[i : i + batch], gids[i : i + batch], tids[i * gsize : (i + batch) * gsize])
            for i in range(0, n, batch)
        ]

        def raw_copy() -> None:
            for b in batches:
                copy_batch(raw_conn, b)

        timed("raw_copy", raw_copy)
        del batches
        timed("orm", lambda: orm(orm_engine))  # one commit per group, server default synchronous_commit = on
        timed("api_sync", lambda: api(store_on))
        timed("orm_async", lambda: orm(orm_async_engine))
        log("ingest round %d: " % (rnd + 1) + ", ".join(
            f"{k} {rows_per_round / v[-1]:,.0f} rows/s" for k, v in times.items()))

    log("ingest: per-statement CPU of the API ...")
    diag = diagnose_api(url, groups[: min(n, 500)])
    rate = {k: rows_per_round / statistics.median(v) for k, v in times.items()}
    out = {
        "groups_per_round": n,
        "rows_per_round": rows_per_round,
        "rounds": args.rounds,
        "copy_batch_groups": batch,
        "approx_kib_per_row": round(approx_bytes / 1024, 2),
        "rows_per_s": {k: round(v) for k, v in rate.items()},
        "rows_per_s_all_rounds": {k: [round(rows_per_round / x) for x in v] for k, v in times.items()},
        "ms_per_group": {k: round(1000 / (v / gsize), 3) for k, v in rate.items()},
        # CPU per group, median over rounds: this process (client) and every process of the
        # embedded server (backends, WAL writer, checkpointer...); None with --url
        "client_cpu_ms_per_group": {k: round(1000 * statistics.median(c[0] for c in v), 3) for k, v in cpu.items()},
        "server_cpu_ms_per_group": {
            k: None if v[0][1] is None else round(1000 * statistics.median(c[1] for c in v), 3) for k, v in cpu.items()
        },
        "ratios": {
            "api_async/raw_copy": round(rate["api_async"] / rate["raw_copy"], 3),
            "api_sync/raw_copy": round(rate["api_sync"] / rate["raw_copy"], 3),
            "api_async/orm": round(rate["api_async"] / rate["orm"], 2),
            "api_sync/orm": round(rate["api_sync"] / rate["orm"], 2),
            "api_async/orm_async": round(rate["api_async"] / rate["orm_async"], 2),
            "api_batch8/raw_copy": round(rate["api_batch8"] / rate["raw_copy"], 3),
            "api_batch8/orm": round(rate["api_batch8"] / rate["orm"], 2),
            "api_batch64/raw_copy": round(rate["api_batch64"] / rate["raw_copy"], 3),
        },
    }
    out["api_statements_cpu_ms_per_group"] = diag
    out["loadavg_end"] = os.getloadavg()
    results["ingest"] = out
    log("ingest: " + json.dumps(out["rows_per_s"]) + " " + json.dumps(out["ratios"]))

    raw_conn.close()
    orm_engine.dispose()
    orm_async_engine.dispose()


def diagnose_api(url: str, groups: list[GroupIn]) -> dict:
    """Server CPU of each statement the API sends for a group, and client CPU around them.

    Replays ``Store.write_groups`` for one group at a time on a connection of our own, with the
    Store's own statement helpers, reading the backend's CPU time between statements.
    """
    store = Store(make_engine(url, pool_size=1))
    conn = connect_raw(url)
    pid = conn.info.backend_pid
    acc: dict[str, list[float]] = {}

    step = _cpu_steps(pid, acc)

    import reflexdb.store as st

    real_copy = st.copy_rows

    def copy(cur, table, *a):
        step(f"COPY {table}", lambda: real_copy(cur, table, *a))

    st.copy_rows = copy
    fresh_write_keys(groups)
    try:
        for g in groups:
            p = step("validate (prepare_group)", lambda: prepare_group(g))
            cur = conn.cursor()

            def first():
                with conn.pipeline():
                    conn.execute("SET LOCAL synchronous_commit = off")
                    store._insert_groups(cur, [p])
                return [(gid, tid) for _, gid, tid in cur.fetchall()]

            rows = step("BEGIN + SET LOCAL + insert_groups (one round trip)", first)
            out = st._Rows()
            store._group_rows(p, rows, out)
            out.copy(cur)
            step("COMMIT", conn.commit)
    finally:
        st.copy_rows = real_copy
        conn.close()
        store.close()
    n = len(groups)
    return {k: {"server_ms": round(v[0] * 1000 / n, 3), "client_ms": round(v[1] * 1000 / n, 3)} for k, v in acc.items()}


# ---------------------------------------------------------------------------------------------- section 2


def load_run(url: str, run: int, task_ids: list[int], n_traj: int, templates: list[RawGroup], *,
             batch_groups: int = 500) -> float:
    """Append groups to ``run`` by raw COPY until it has ``n_traj`` trajectories; return seconds."""
    gsize = len(templates[0].trajs)
    dim = templates[0].embeds[0][3].shape[0]
    rng = np.random.default_rng(n_traj)
    conn = connect_raw(url, autocommit=True)
    have = conn.execute("SELECT count(*) FROM trajectories WHERE run_id = %s", (run,)).fetchone()[0]
    todo = (n_traj - have) // gsize
    t0 = time.perf_counter()
    done = 0
    last = t0
    while done < todo:
        b = min(batch_groups, todo - done)
        with conn.transaction():
            gids = allocate_ids(conn, "groups", b)
            tids = allocate_ids(conn, "trajectories", b * gsize)
        raws = [templates[(done + i) % len(templates)] for i in range(b)]
        rows = raw_tuples(raws, gids, tids)
        # fresh vectors for every trajectory: exact duplicates would make FAISS ties (section 3)
        vectors = rng.standard_normal((len(rows[4]), dim), dtype=np.float32)
        rows = (*rows[:4], [(*r[:4], v, r[5]) for r, v in zip(rows[4], vectors)])
        copy_batch(conn, rows)
        done += b
        now = time.perf_counter()
        if now - last > 30:
            last = now
            log(f"  loaded {(have + done * gsize):,} trajectories ({done * gsize / (now - t0):,.0f} rows/s)")
    conn.close()
    return time.perf_counter() - t0


def vacuum_analyze(url: str) -> float:
    t0 = time.perf_counter()
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for t in ("groups", "trajectories", "turns", "token_bytes", "embeddings"):
            conn.execute(f"VACUUM ANALYZE {t}")
    return time.perf_counter() - t0


def time_sampling(store: Store, run: int, args) -> dict:
    """ids-selection + read_groups(ids, payloads=True), ``args.samples`` times."""
    rng = np.random.default_rng(7)
    k = args.batch_groups
    lo_hi = "SELECT min(id), max(id) FROM groups WHERE run_id = %s"
    with store.transaction() as conn:  # sanity: ids are contiguous (raw COPY allocated them in order)
        lo, hi = conn.execute(lo_hi, (run,)).fetchone()
        count = conn.execute("SELECT count(*) FROM groups WHERE run_id = %s", (run,)).fetchone()[0]
    assert count == hi - lo + 1, "group ids of the sampled run are not contiguous"
    # warm-up (connection pool, plans)
    for _ in range(5):
        store.read_groups(rng.choice(np.arange(lo, hi + 1), k, replace=False).tolist(), payloads=True)
    lat, select_ms, trajs = [], [], 0
    s0, c0 = server_cpu(), time.process_time()
    for _ in range(args.samples):
        t0 = time.perf_counter()
        with store.engine.connect() as c:
            lo, hi = c.exec_driver_sql(lo_hi, (run,)).one()
        ids = (lo + rng.choice(hi - lo + 1, k, replace=False)).tolist()
        t1 = time.perf_counter()
        groups = store.read_groups(ids, payloads=True)
        t2 = time.perf_counter()
        lat.append((t2 - t0) * 1000)
        select_ms.append((t1 - t0) * 1000)
        trajs += sum(len(g.trajectories) for g in groups)
        assert len(groups) == k and groups[0].trajectories[0].logprobs.dtype == np.float32
    c1, s1 = time.process_time(), server_cpu()
    return {
        "client_cpu_ms_per_sample": round((c1 - c0) * 1000 / args.samples, 2),
        "server_cpu_ms_per_sample": None if s0 is None or s1 is None else round((s1 - s0) * 1000 / args.samples, 2),
        "samples": args.samples,
        "groups_per_sample": k,
        "trajectories_per_sample": trajs / args.samples,
        "p50_ms": round(pct(lat, 50), 2),
        "p90_ms": round(pct(lat, 90), 2),
        "p99_ms": round(pct(lat, 99), 2),
        "max_ms": round(max(lat), 2),
        "id_selection_p50_ms": round(pct(select_ms, 50), 3),
    }


def diagnose_read(url: str, run: int, args, n: int = 30) -> dict:
    """Server and client CPU of each query of ``read_groups`` (run one after the other here).

    Uses the Store's queries on a connection of our own; ``read_groups`` itself fetches half of
    the payloads on a second connection at the same time.
    """
    from reflexdb.records import Trajectory, Turn
    from reflexdb.store import Q

    conn = connect_raw(url)
    pid = conn.info.backend_pid
    rng = np.random.default_rng(3)
    acc: dict[str, list[float]] = {}

    step = _cpu_steps(pid, acc)

    lo, hi = conn.execute("SELECT min(id), max(id) FROM groups WHERE run_id = %s", (run,)).fetchone()
    for i in range(n + 3):
        if i == 3:
            acc.clear()
        gids = (lo + rng.choice(hi - lo + 1, args.batch_groups, replace=False)).tolist()
        cur = conn.cursor(binary=True)
        step("select_groups", lambda: cur.execute(Q["select_groups"], {"ids": gids}).fetchall())
        trows = step("select_trajectories_of_groups",
                     lambda: cur.execute(Q["select_trajectories_of_groups"], {"ids": gids, "runs": [run]}).fetchall())
        tids = [r[0] for r in trows]
        prows = step("select_payloads (bytea, one block per array)",
                     lambda: _payload_cursor(conn.cursor(binary=True)).execute(
                         Q["select_payloads"], {"ids": tids, "runs": [run]}).fetchall())
        urows = step("select_turns", lambda: cur.execute(Q["select_turns"], {"ids": tids, "runs": [run]}).fetchall())

        def build():
            extra = {t: {} for t in tids}
            for tid, *arrays in prows:
                extra[tid].update(zip(_PAYLOAD_COLUMNS[1:], payload_arrays(arrays)))
            turns: dict[int, list] = {}
            for tid, *f in urows:
                turns.setdefault(tid, []).append(Turn(*f))
            for tid, ts in turns.items():
                extra[tid]["turns"] = tuple(ts)
            return [Trajectory(*r, **extra[r[0]]) for r in trows]

        step("build Trajectory / Turn records", build)
        step("COMMIT", conn.commit)
    conn.close()
    return {k: {"server_ms": round(v[0] * 1000 / n, 2), "client_ms": round(v[1] * 1000 / n, 2)} for k, v in acc.items()}


def bench_sample(url: str, args, results: dict) -> tuple[int, Store]:
    engine = make_engine(url)
    store = Store(engine)
    run = store.create_run("bench-sample")
    tasks = store.add_tasks(run, [TaskIn(prompt=f"sample task {i}", dataset="bench-sample") for i in range(4096)])
    log("sample: generating templates ...")
    templates = [to_raw(g) for g in make_groups(args.template_groups, run, tasks, seed=2)]
    # spread the templates' groups over all tasks
    for i, t in enumerate(templates):
        task = tasks[i % len(tasks)]
        t.group = (t.group[0], task, *t.group[2:])
        t.trajs = [(tr[0], task, *tr[2:]) for tr in t.trajs]
    out = {}
    for size in args.sample_sizes:
        log(f"sample: loading the run to {size:,} trajectories by raw COPY ...")
        secs = load_run(url, run, tasks, size, templates)
        vac = vacuum_analyze(url)
        with engine.connect() as c:
            db_bytes = c.exec_driver_sql("SELECT pg_database_size(current_database())").scalar()
        log(f"sample: loaded in {secs:.0f} s, VACUUM ANALYZE {vac:.0f} s, database {db_bytes / 2**30:.2f} GiB; timing ...")
        r = time_sampling(store, run, args)
        r["read_steps_cpu_ms_per_sample"] = diagnose_read(url, run, args)
        r.update(load_s=round(secs, 1), vacuum_analyze_s=round(vac, 1), database_gib=round(db_bytes / 2**30, 2),
                 loadavg=os.getloadavg())
        out[str(size)] = r
        log(f"sample @ {size:,}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms")
    results["sample"] = out
    return run, store


# ---------------------------------------------------------------------------------------------- section 3


def bench_faiss(store: Store, run: int, args, results: dict) -> None:
    try:
        from reflexdb.index import EmbeddingIndex
    except ImportError as exc:
        results["faiss"] = {"skipped": f"reflexdb.index not importable: {exc}"}
        log(f"faiss: skipped ({exc})")
        return
    rng = np.random.default_rng(11)
    with store.transaction() as conn:
        n_vec = conn.execute("SELECT count(*) FROM embeddings e JOIN trajectories t ON t.id = e.trajectory_id "
                             "WHERE t.run_id = %s", (run,)).fetchone()[0]
        lo, hi = conn.execute("SELECT min(id), max(id) FROM trajectories WHERE run_id = %s", (run,)).fetchone()
        # one task's failures (its latest 50), as the ~50-id restriction
        task = conn.execute("SELECT task_id FROM groups WHERE run_id = %s ORDER BY id DESC LIMIT 1", (run,)).fetchone()[0]
        fail_ids = [r[0] for r in conn.execute(
            "SELECT id FROM trajectories WHERE task_id = %s AND correct = false ORDER BY id DESC LIMIT 50", (task,)
        ).fetchall()]
    log(f"faiss: opening the index over {n_vec:,} vectors ...")
    t0 = time.perf_counter()
    index = EmbeddingIndex.open(store, run, directory=Path(args.faiss_dir))
    t_open = time.perf_counter() - t0
    t0 = time.perf_counter()
    index.catch_up()
    t_build = time.perf_counter() - t0
    log(f"faiss: open {t_open:.1f} s, catch_up {t_build:.1f} s")
    # queries: stored vectors plus noise (a new trajectory near existing ones)
    with store.transaction() as conn:
        cur = conn.cursor(binary=True)
        qids = (lo + rng.choice(hi - lo + 1, 64, replace=False)).tolist()
        qv = [r[0] for r in cur.execute("SELECT vector FROM embeddings WHERE trajectory_id = ANY(%s)", (qids,))]
    queries = [(v + 0.1 * rng.standard_normal(v.shape[0]).astype(np.float32)).astype(np.float32) for v in qv]
    k = args.faiss_k
    cases = {
        f"one task's failures ({len(fail_ids)} ids)": lambda: fail_ids,
        "5000 ids": lambda: (lo + rng.choice(hi - lo + 1, 5000, replace=False)).tolist(),
        "unrestricted": lambda: None,
    }
    out = {"vectors": n_vec, "open_s": round(t_open, 2), "catch_up_s": round(t_build, 1), "k": k, "cases": {}}
    for name, make_ids in cases.items():
        lat = []
        for i in range(5):  # warm-up
            ids = make_ids()
            index.search(queries[i][None, :], k, restrict_to=ids) if ids is not None else index.search(queries[i][None, :], k)
        for i in range(args.faiss_queries):
            ids = make_ids()
            q = queries[i % len(queries)][None, :]
            t0 = time.perf_counter()
            res = index.search(q, k, restrict_to=ids) if ids is not None else index.search(q, k)
            lat.append((time.perf_counter() - t0) * 1000)
        assert len(res) == 1
        if ids is not None:
            allowed = set(ids)
            assert all(nb.trajectory_id in allowed for nb in res[0]), "restricted search returned an id outside restrict_to"
        out["cases"][name] = {"queries": len(lat), "p50_ms": round(pct(lat, 50), 3), "p99_ms": round(pct(lat, 99), 3),
                              "hits": len(res[0])}
        log(f"faiss {name}: p50 {pct(lat, 50):.2f} ms, p99 {pct(lat, 99):.2f} ms")
    out["loadavg_end"] = os.getloadavg()
    results["faiss"] = out


# ---------------------------------------------------------------------------------------------- report


def markdown(results: dict) -> str:
    """The tables of docs/benchmarks.md, from a results dict (``--report results.json``)."""
    out = []
    m = results["machine"]
    out.append(f"Run {results['date']}: `{results['command']}`; {m.get('cpus')} CPUs ({m.get('cpu', '?')}), "
               f"{m.get('mem_gib')} GiB RAM, PostgreSQL {m.get('postgres')} (shared_buffers {m.get('pg_shared_buffers')}), "
               f"load average at start {m['loadavg_start'][0]:.2f}, at end {results['loadavg_end'][0]:.2f}.\n")
    if "ingest" in results:
        i = results["ingest"]
        out.append(f"Ingest: {i['rows_per_round']:,} trajectories ({i['groups_per_round']} groups of 8, "
                   f"~{i['approx_kib_per_row']} KiB each) per method per round, {i['rounds']} rounds, median round; "
                   f"raw COPY in transactions of {i['copy_batch_groups']} groups.\n")
        out.append("| method | rows/s | ms per group | client CPU ms/group | server CPU ms/group | rows/s each round |")
        out.append("|---|---:|---:|---:|---:|---|")
        names = {
            "api_async": "API `write_group`, synchronous_commit off (default)",
            "api_sync": "API `write_group`, synchronous_commit on",
            "api_batch8": "API `write_groups`, 8 groups per transaction, synchronous_commit off",
            "api_batch64": "API `write_groups`, 64 groups per transaction, synchronous_commit off",
            "raw_copy": "raw binary COPY (ceiling)",
            "orm": "ORM object + pickle, commit per group (sync on)",
            "orm_async": "ORM object + pickle, commit per group (sync off)",
        }
        for k, label in names.items():
            sc = i["server_cpu_ms_per_group"][k]
            out.append(f"| {label} | {i['rows_per_s'][k]:,} | {i['ms_per_group'][k]:.2f} | "
                       f"{i['client_cpu_ms_per_group'][k]:.2f} | {'-' if sc is None else f'{sc:.2f}'} | "
                       f"{', '.join(f'{x:,}' for x in i['rows_per_s_all_rounds'][k])} |")
        out.append("")
        d = i.get("api_statements_cpu_ms_per_group")
        if d:
            out.append("Where a `write_group` goes (synchronous_commit off), per group:\n")
            out.append("| step | server CPU ms | client CPU ms |")
            out.append("|---|---:|---:|")
            for k, v in d.items():
                out.append(f"| {k} | {v['server_ms']:.3f} | {v['client_ms']:.3f} |")
            out.append(f"| total | {sum(v['server_ms'] for v in d.values()):.3f} | "
                       f"{sum(v['client_ms'] for v in d.values()):.3f} |")
            out.append("")
        out.append("| ratio | value |")
        out.append("|---|---:|")
        for k, v in i["ratios"].items():
            out.append(f"| {k} | {v} |")
        out.append("")
    if "sample" in results:
        out.append("| stored trajectories | p50 ms | p90 ms | p99 ms | max ms | id selection p50 ms | "
                   "client CPU ms/sample | server CPU ms/sample | load avg (1 min) |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for size, r in results["sample"].items():
            sc = r["server_cpu_ms_per_sample"]
            out.append(f"| {int(size):,} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['max_ms']} | "
                       f"{r['id_selection_p50_ms']} | {r['client_cpu_ms_per_sample']} | {'-' if sc is None else sc} | "
                       f"{r['loadavg'][0]:.2f} |")
        out.append("")
        for size, r in results["sample"].items():
            d = r.get("read_steps_cpu_ms_per_sample")
            if not d:
                continue
            out.append(f"Where a sample of {int(size):,} goes, the queries of `read_groups` run one after "
                       "the other on one connection (CPU per sample):\n")
            out.append("| step | server CPU ms | client CPU ms |")
            out.append("|---|---:|---:|")
            for k, v in d.items():
                out.append(f"| {k} | {v['server_ms']:.2f} | {v['client_ms']:.2f} |")
            out.append(f"| total | {sum(v['server_ms'] for v in d.values()):.2f} | "
                       f"{sum(v['client_ms'] for v in d.values()):.2f} |")
            out.append("")
    f = results.get("faiss")
    if f and "cases" in f:
        out.append(f"FAISS: {f['vectors']:,} vectors; `catch_up()` from empty {f['catch_up_s']} s; k = {f['k']}.\n")
        out.append("| search | queries | p50 ms | p99 ms |")
        out.append("|---|---:|---:|---:|")
        for name, c in f["cases"].items():
            out.append(f"| {name} | {c['queries']} | {c['p50_ms']} | {c['p99_ms']} |")
        out.append("")
    elif f:
        out.append(f"FAISS: {f.get('skipped')}\n")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    global _PGDATA
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an external PostgreSQL (SQLAlchemy URL); default: a fresh embedded server")
    ap.add_argument("--workdir", help="the embedded server's directory, kept after the run; a later run with the "
                    "same --workdir reuses the loaded trajectories (default: a temp dir, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--sections", default="ingest,sample,faiss")
    ap.add_argument("--ingest-groups", type=int, default=1000, help="groups of 8 per method per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--copy-batch-groups", type=int, default=250, help="groups per raw COPY transaction")
    ap.add_argument("--sample-sizes", default="100000,1000000", help="trajectories stored, comma-separated")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--batch-groups", type=int, default=64)
    ap.add_argument("--template-groups", type=int, default=500, help="distinct groups cycled when loading")
    ap.add_argument("--faiss-queries", type=int, default=200)
    ap.add_argument("--faiss-k", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="small sizes: about a minute")
    args = parse_or_report(ap, argv, markdown)
    if args is None:
        return 0
    if args.quick:
        args.ingest_groups, args.rounds, args.sample_sizes = 250, 2, "50000"
        args.samples, args.template_groups, args.faiss_queries = 100, 100, 50
    args.sample_sizes = [int(s) for s in args.sample_sizes.split(",") if s]
    sections = set(args.sections.split(","))

    tmp = None
    admin_url = None
    if args.url:
        admin_url = args.url
        dbname = f"reflexdb_bench_{os.getpid()}"
        with psycopg.connect(libpq_url(admin_url), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{dbname}"')
        url = _with_database(admin_url, dbname)
    else:
        from reflexdb import embedded

        tmp = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="reflexdb-bench-"))
        url = embedded.server_uri(tmp / "pgdata")
        _PGDATA = (tmp / "pgdata").resolve()
    log(f"server: {url}")
    t0 = time.perf_counter()
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(url),
        "args": {k: v for k, v in vars(args).items() if k != "url"},
    }
    log(f"machine: {results['machine']}")
    args.faiss_dir = str((tmp or Path(tempfile.gettempdir())) / f"faiss-{os.getpid()}")
    try:
        if "ingest" in sections:
            bench_ingest(url, args, results)
        if sections & {"sample", "faiss"}:
            run, store = bench_sample(url, args, results) if "sample" in sections or "faiss" in sections else (None, None)
            if "faiss" in sections:
                bench_faiss(store, run, args, results)
            store.close()
    finally:
        results["loadavg_end"] = os.getloadavg()
        results["total_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(results, indent=2, default=str))
        try:
            print(markdown(json.loads(json.dumps(results, default=str))))
        except (KeyError, TypeError, IndexError) as exc:  # a section failed part-way
            log(f"no markdown summary: {exc!r}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(results, indent=2, default=str) + "\n")
        if admin_url:
            with psycopg.connect(libpq_url(admin_url), autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        elif tmp is not None:
            from reflexdb import embedded

            embedded.stop(tmp / "pgdata")
            if not args.keep and not args.workdir:
                shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(args.faiss_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
