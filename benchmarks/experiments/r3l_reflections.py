"""What the base policy does with R3L's reflection step, measured before any training (docs/r3l.md).

For each reflection decoding (``free``: the paper; ``json_schema``: constrained by xgrammar), a
collector with the untrained policy (v0) collects ``--groups`` tasks of an R3L config in a fresh
run of one database (embedded PostgreSQL in a fresh ``REFLEXDB_HOME`` unless
``REFLEXDB_DATABASE_URL`` is set), and the view ``r3l_reflections`` says: how many reflections were
valid, why the others were not, the outcomes and pivots, how many retries improved on their base
episode, and a few stored reflections verbatim.

    python benchmarks/experiments/r3l_reflections.py --groups 8 --json-out benchmarks/results/r3l_reflections_v0.json
    python benchmarks/experiments/r3l_reflections.py --groups 8 --decodings json_schema --set tasks.level=1
"""

from __future__ import annotations

import argparse
import time

from v0 import ROOT, collector, common_options, new_results, open_store, rows, write

CONFIG = ROOT / "examples" / "arithmetic-r3l.yaml"

SUMMARY = """
SELECT count(*), count(*) FILTER (WHERE valid), count(*) FILTER (WHERE outcome = 'success'),
       count(*) FILTER (WHERE outcome = 'success_but_inefficient'), count(*) FILTER (WHERE outcome = 'failure'),
       count(retry_trajectory_id), count(*) FILTER (WHERE improved), avg(pivot) FILTER (WHERE retry_trajectory_id IS NOT NULL),
       avg(base_reward), avg(retry_reward), count(*) FILTER (WHERE base_reward < 1)
FROM r3l_reflections r JOIN runs u ON u.id = r.run_id
WHERE u.name = :run
"""
ERRORS = """
SELECT regexp_replace(r.error, '[0-9]+', 'N', 'g') AS kind, count(*) FROM r3l_reflections r
JOIN runs u ON u.id = r.run_id
WHERE u.name = :run AND NOT r.valid GROUP BY 1 ORDER BY 2 DESC
"""
EXAMPLES = """
SELECT reflection_id, valid, outcome, pivot, base_reward, retry_reward, left(raw_text, 600) FROM r3l_reflections r
JOIN runs u ON u.id = r.run_id WHERE u.name = :run ORDER BY valid DESC, improved DESC NULLS LAST, reflection_id LIMIT :n
"""


def measure(decoding: str, groups: int, store, seed: int, overrides: dict) -> dict:
    collect, run = collector(store, CONFIG, f"r3l-v0-{decoding}", decoding,
                             {**overrides, "r3l.decoding": decoding, "seed": seed})
    t0 = time.monotonic()
    collect.run(max_groups=2 * groups)  # each task: its exploration group and its retry group
    seconds = time.monotonic() - t0
    with store.engine.connect() as conn:
        [(n, valid, success, ineff, failure, retried, improved, pivot, base_r, retry_r, failed_bases)] = rows(
            conn, SUMMARY, run)
        errors = rows(conn, ERRORS, run)
        examples = rows(conn, EXAMPLES, run, n=4)
    return {
        "decoding": decoding, "overrides": overrides, "run": run, "tasks": groups, "seconds": round(seconds, 1), "reflections": n,
        "valid": valid, "invalid_rate": 1 - valid / n if n else None,
        "outcomes": {"success": success, "success_but_inefficient": ineff, "failure": failure},
        "retries": retried, "improved": improved, "retry_improvement_rate": improved / retried if retried else None,
        "mean_pivot": float(pivot) if pivot is not None else None, "base_reward_mean": base_r,
        "retry_reward_mean": retry_r, "failed_base_episodes": failed_bases,
        "errors": [{"error": e, "count": c} for e, c in errors],
        "examples": [{"reflection_id": i, "valid": v, "outcome": o, "pivot": p, "base_reward": b, "retry_reward": r,
                      "text": t} for i, v, o, p, b, r, t in examples],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=8, help="tasks per decoding (N/2 reflections each)")
    ap.add_argument("--decodings", default="free,json_schema")
    args = common_options(ap, "override a config key, e.g. --set tasks.level=1 (repeatable; the value is YAML)"
                          ).parse_args()
    store = open_store("reflexdb-r3l-v0-")
    from reflexdb.config import parse_overrides

    out = new_results(CONFIG)
    overrides = parse_overrides(args.overrides)
    out["results"] = [measure(d, args.groups, store, args.seed, overrides) for d in args.decodings.split(",")]
    store.close()
    for r in out["results"]:
        print(f"{r['decoding']:12} reflections {r['reflections']:3}  invalid {r['invalid_rate']:.2f}  "
              f"outcomes {r['outcomes']}  retries {r['retries']}  improved {r['improved']}  "
              f"mean pivot {r['mean_pivot']}  {r['seconds']} s")
        for e in r["errors"][:5]:
            print(f"    {e['count']:3} × {e['error']}")
    write(args.json_out, out)


if __name__ == "__main__":
    main()
