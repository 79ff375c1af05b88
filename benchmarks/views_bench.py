"""The two views that read composed views since revision 0021, timed before and after it.

``untrained_groups`` reads ``group_holds`` (LTE's reasons) and ``failures`` reads
``failure_notes`` (R3L's root cause) instead of the methods' tables. This script fills a scratch
database on a PostgreSQL server with one run of ``--tasks`` tasks × ``--rounds`` groups of 4
trajectories (about a third of them failed, no step recorded, so every group is untrained and
``group_holds`` is read for each), times both views for the run at the head revision, downgrades
to 0020 (the definitions before) and times them again on the same rows::

    python benchmarks/views_bench.py --url postgresql://127.0.0.1:5432/postgres --tasks 200 --rounds 20

It creates and drops the database ``reflexdb_views_bench`` on that server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psycopg
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUERIES = {
    "untrained_groups": "SELECT count(*) FROM untrained_groups WHERE run_id = :r",
    "failures": "SELECT count(*), count(root_cause) FROM failures WHERE run_id = :r",
}
DB = "reflexdb_views_bench"


def timed(url: str, run: int, repeats: int) -> dict[str, float]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    out = {}
    with engine.connect() as conn:
        for name, sql in QUERIES.items():
            conn.execute(text(sql), {"r": run}).fetchall()  # warm
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                conn.execute(text(sql), {"r": run}).fetchall()
                times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times) * 1000
    engine.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="postgresql://127.0.0.1:5432/postgres", help="a server's maintenance database")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    from reflexdb import Store

    from reflexdb.ops import admin
    from tests.factories import make_group, setup_run

    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB}")
        conn.execute(f"CREATE DATABASE {DB}")
    url = args.url.rsplit("/", 1)[0] + "/" + DB
    try:
        admin.upgrade(url)
        store = Store.open(url)
        rng = np.random.default_rng(0)
        run, tasks = setup_run(store, "views-bench", args.tasks)
        for _ in range(args.rounds):
            store.write_groups([make_group(rng, run, t, size=4, dim=None, n_correct=int(rng.integers(0, 3)))
                                for t in tasks])
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
            groups = conn.execute(text("SELECT count(*) FROM groups WHERE run_id = :r"), {"r": run}).scalar()
        store.close()
        after = timed(url, run, args.repeats)
        admin.downgrade(url, "0020")
        before = timed(url, run, args.repeats)
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    print(f"{groups} groups of 4 trajectories, medians of {args.repeats}")
    print("| view | before (0020) | after (head) | ratio |\n|---|---:|---:|---:|")
    for name in QUERIES:
        print(f"| `{name}` | {before[name]:.1f} ms | {after[name]:.1f} ms | {after[name] / before[name]:.2f} |")


if __name__ == "__main__":
    main()
