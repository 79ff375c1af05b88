"""Bytes on disk per trajectory, by response length (docs/operations.md, "Scaling out").

Writes the same kind of groups as ``store_bench.py`` (8 trajectories of ``T`` response tokens,
~40 prompt tokens, a 576-d embedding, ~1.2 KB of text in two turns) through ``Store.write_groups``
into one run per response length, in a fresh embedded PostgreSQL, then reads each run's size from
the catalog: its partitions (``run_partitions_size``: trajectories, turns, token_bytes, embeddings,
consumption, with indexes and TOAST) plus its share of ``groups``. ``VACUUM ANALYZE`` first, so
the free-space maps and visibility maps are counted as they will be.

    python benchmarks/bytes_per_trajectory.py                 # T = 100, 300, 1000, 3000, 8000
    python benchmarks/bytes_per_trajectory.py --groups 200 --json-out bytes.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from reflexdb import Store, TaskIn, migrate  # noqa: E402
from reflexdb.db import libpq_url, make_engine  # noqa: E402
from store_bench import make_groups  # noqa: E402


def measure(url: str, lengths: list[int], n_groups: int, dim: int) -> list[dict]:
    engine = make_engine(url)
    migrate.upgrade(engine)
    store = Store(engine)
    out = []
    for T in lengths:
        run = store.create_run(f"bytes-T{T}")
        tasks = store.add_tasks(run, [TaskIn(prompt=f"task {i}", dataset="bytes") for i in range(64)])
        groups = make_groups(n_groups, run, tasks, T=T, dim=dim, seed=T)
        t0 = time.perf_counter()
        for i in range(0, len(groups), 8):
            store.write_groups(groups[i : i + 8])
        secs = time.perf_counter() - t0
        out.append({"T": T, "run_id": run, "groups": n_groups, "trajectories": 8 * n_groups,
                    "write_s": round(secs, 2)})
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        groups_bytes = conn.execute("SELECT pg_total_relation_size('groups')").fetchone()[0]
        n_all = conn.execute("SELECT count(*) FROM groups").fetchone()[0]
        for r in out:
            part = conn.execute("SELECT run_partitions_size(%s)", (r["run_id"],)).fetchone()[0]
            by_table = dict(conn.execute(
                "SELECT t, pg_total_relation_size(to_regclass(t || '_r' || %s)) FROM unnest(ARRAY['trajectories', "
                "'turns', 'token_bytes', 'embeddings']) t", (r["run_id"],)).fetchall())
            share = groups_bytes * r["groups"] / n_all
            n = r["trajectories"]
            r.update(bytes_per_trajectory=round((part + share) / n),
                     per_table={k: round(v / n) for k, v in by_table.items()},
                     groups_share=round(share / n))
    store.close()
    return out


def report(rows: list[dict], meta: dict) -> str:
    lines = [f"Run {meta['date']}: `{meta['command']}`; {meta['groups']} groups of 8 per length, embedding "
             f"{meta['dim']}-d, PostgreSQL {meta['postgres']}.\n",
             "| response tokens | bytes per trajectory | trajectories | turns | token_bytes | embeddings | "
             "groups (share) | GB per million trajectories |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["per_table"]
        lines.append(f"| {r['T']:,} | {r['bytes_per_trajectory']:,} | {t['trajectories']:,} | {t['turns']:,} | "
                     f"{t['token_bytes']:,} | {t['embeddings']:,} | {r['groups_share']:,} | "
                     f"{r['bytes_per_trajectory'] * 1e6 / 1e9:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="100,300,1000,3000,8000")
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--dim", type=int, default=576)
    ap.add_argument("--url", help="an external server's database (default: a fresh embedded server)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    tmp = None
    try:
        if args.url:
            url = args.url
        else:
            from reflexdb.embedded import server_uri

            tmp = tempfile.mkdtemp(prefix="reflexdb-bytes-")
            url = server_uri(Path(tmp) / "pgdata")
        rows = measure(url, lengths, args.groups, args.dim)
        with psycopg.connect(libpq_url(url)) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
    finally:
        if tmp:
            from reflexdb import embedded

            embedded.stop(Path(tmp) / "pgdata")
            shutil.rmtree(tmp, ignore_errors=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": "python " + " ".join(sys.argv), "groups": args.groups,
            "dim": args.dim, "postgres": version, "loadavg": os.getloadavg()}
    text = report(rows, meta)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
