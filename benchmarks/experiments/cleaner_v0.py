"""What the base policy does with a Python tool, measured before any training (docs/cleaner.md).

CLEANER needs a regime: frequent tool errors that the model can fix. For each task setting, a
collector with the untrained policy (v0) collects ``--groups`` tasks of examples/arithmetic-cleaner.yaml
(SAAR on every episode, K = 3) in a fresh run of one database (embedded PostgreSQL in a fresh
``REFLEXDB_HOME`` unless ``REFLEXDB_DATABASE_URL`` is set), and the view ``cleaner_tool_errors``
says: how many episodes wrote a code block at all, how many calls ran, the raw tool errors per
episode, how many failed calls a correction fixed (shallow or deep), pass@1; the errors by kind
and a few stored turns verbatim.

    python benchmarks/experiments/cleaner_v0.py --json-out benchmarks/results/cleaner_v0_shot.json   # the example's prompt
    python benchmarks/experiments/cleaner_v0.py --set tasks.template=tool_python --json-out benchmarks/results/cleaner_v0_plain.json
    python benchmarks/experiments/cleaner_v0.py --settings level7 --groups 2
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from v0 import ROOT, collector, common_options, new_results, open_store, rows, write

CONFIG = ROOT / "examples" / "arithmetic-cleaner.yaml"
#: ../shared/data/gsm8k/train.jsonl beside the project (REFLEXDB_SHARED: that folder, when run from a copy elsewhere)
GSM8K = Path(os.environ.get("REFLEXDB_SHARED") or ROOT.parent / "shared") / "data" / "gsm8k" / "train.jsonl"

#: name -> config overrides (the task; the method is the example's)
SETTINGS = {
    "level7": {"tasks.level": 7},
    "level8": {"tasks.level": 8},
    # easier levels, for groups where some episodes are solved (the pilot's all-fail groups gave no gradient)
    "level4": {"tasks.level": 4},
    "level6": {"tasks.level": 6},
    "levels2_8": {"tasks.level": [2, 8]},
    "levels4_6_8": {"tasks.level": [4, 6, 8]},
    # a library call (math.comb, factorial, gcd, lcm, isqrt): code that fails fixably when `import math` is
    # forgotten (issue 37's regime of frequent recoverable tool errors); alone and with level 4's mixed groups
    "level9": {"tasks.level": 9},
    "levels4_9": {"tasks.level": [4, 9]},
    # the same tasks under a prompt whose worked exchange fails a call for want of `import math` and fixes it
    # in one line (tool_python_fix_shot): does the model then make the recoverable error, and fix it?
    "level9_fixshot": {"tasks.level": 9, "tasks.template": "tool_python_fix_shot"},
    "levels4_9_fixshot": {"tasks.level": [4, 9], "tasks.template": "tool_python_fix_shot"},
    "gsm8k": {"tasks.source": "file", "tasks.path": str(GSM8K), "tasks.train_size": 200, "tasks.eval_size": 20,
              "collector.sampling.max_new_tokens": 256},
}

SUMMARY = """
SELECT count(*), count(*) FILTER (WHERE raw_tool_calls > 0), sum(raw_tool_calls), sum(raw_tool_errors),
       sum(rollbacks), sum(recovered), sum(shallow), sum(deep), avg(reward), count(*) FILTER (WHERE origin = 'purified')
FROM cleaner_tool_errors v JOIN runs u ON u.id = v.run_id WHERE u.name = :run
"""
# training groups by how many of their episodes are solved: only a mixed group carries a gradient
GROUPS = """
SELECT count(*) FILTER (WHERE solved = 0), count(*) FILTER (WHERE solved > 0 AND solved < n),
       count(*) FILTER (WHERE solved = n)
FROM (SELECT v.group_id, count(*) AS n, count(*) FILTER (WHERE v.correct) AS solved
      FROM cleaner_tool_errors v JOIN runs u ON u.id = v.run_id
      WHERE u.name = :run AND v.group_kind = 'fresh' GROUP BY v.group_id) g
"""
CALLS = """
SELECT c ->> 'status', count(*), avg((c ->> 'seconds')::float)
FROM trajectories t JOIN runs u ON u.id = t.run_id JOIN groups g ON g.id = t.group_id,
     jsonb_array_elements(t.meta -> 'tool_calls') c
WHERE u.name = :run AND t.origin = 'raw' GROUP BY 1 ORDER BY 2 DESC
"""
ERRORS = """
SELECT coalesce(substring(u.text from '([A-Z][A-Za-z]*(Error|Exception)|Timed out|CPU time|[a-z ]*limit|no Python block)'),
                left(u.text, 40)) AS kind,
       count(*)
FROM turns u JOIN trajectories t ON t.id = u.trajectory_id JOIN runs r ON r.id = t.run_id
WHERE r.name = :run AND t.origin = 'raw' AND u.role = 'tool' AND u.tool_error GROUP BY 1 ORDER BY 2 DESC
"""
EXAMPLES = """
SELECT p.trajectory_id, p.replacement, p.similarity, left(p.error_text, 300), p.failed_code, p.corrected_code
FROM purifications p JOIN trajectories t ON t.id = p.trajectory_id JOIN runs r ON r.id = t.run_id
WHERE r.name = :run ORDER BY p.recovered DESC, p.trajectory_id LIMIT :n
"""
TURNS = """
SELECT t.id, u.role, left(u.text, 400) FROM turns u JOIN trajectories t ON t.id = u.trajectory_id
JOIN runs r ON r.id = t.run_id
WHERE r.name = :run AND t.origin = 'raw' AND u.token_start IS NOT NULL AND t.id IN (
    SELECT min(t2.id) FROM trajectories t2 JOIN runs r2 ON r2.id = t2.run_id WHERE r2.name = :run AND t2.origin = 'raw'
    GROUP BY t2.meta ->> 'raw_tool_calls' ORDER BY 1 LIMIT 3)
ORDER BY t.id, u.turn_index
"""


def measure(name: str, groups: int, store, seed: int, overrides: dict) -> dict:
    collect, run = collector(store, CONFIG, f"cleaner-v0-{name}", name, {**SETTINGS[name], **overrides, "seed": seed})
    t0 = time.monotonic()
    s = collect.stats  # cumulative; a task with a purified episode writes 2 groups (the raw twins' too)
    while (fresh := s.groups - s.kinds.get("retry", 0)) < groups:
        collect.run(max_groups=s.groups + groups - fresh)
    seconds = time.monotonic() - t0
    with store.engine.connect() as conn:
        [(n, with_code, calls, errors, rollbacks, recovered, shallow, deep, reward, purified)] = rows(conn, SUMMARY, run)
        [(none, mixed, every)] = rows(conn, GROUPS, run)
        statuses = [(s, c, float(sec)) for s, c, sec in rows(conn, CALLS, run)]
        kinds = rows(conn, ERRORS, run)
        examples = rows(conn, EXAMPLES, run, n=4)
        turns = rows(conn, TURNS, run)
    ran = sum(c for s, c, _ in statuses if s == "ok")
    sandbox_calls = sum(c for _, c, _ in statuses)
    return {
        "setting": name, "overrides": {**SETTINGS[name], **overrides}, "run": run, "tasks": groups,
        "seconds": round(seconds, 1), "episodes": n, "with_code": with_code,
        "code_rate": with_code / n if n else None, "sandbox_calls": sandbox_calls, "calls_ok": ran,
        "ok_rate": ran / sandbox_calls if sandbox_calls else None, "tool_turns": calls, "tool_errors": errors,
        "errors_per_episode": errors / n if n else None, "rollbacks": rollbacks, "recovered": recovered,
        "recovery_rate": recovered / rollbacks if rollbacks else None, "shallow": shallow, "deep": deep,
        "purified_episodes": purified, "pass_at_1": reward,
        "groups_none_mixed_all": [none, mixed, every],
        "statuses": [{"status": s, "count": c, "mean_s": round(sec, 4)} for s, c, sec in statuses],
        "error_kinds": [{"kind": k, "count": c} for k, c in kinds],
        "rollback_examples": [{"trajectory_id": i, "replacement": r, "similarity": s, "error": e, "failed_code": f,
                               "corrected_code": c} for i, r, s, e, f, c in examples],
        "episode_examples": [{"trajectory_id": i, "role": r, "text": t} for i, r, t in turns],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=4, help="tasks per setting (G = 8 episodes each)")
    ap.add_argument("--settings", default="level7,level8,gsm8k", help=f"of {', '.join(SETTINGS)}")
    args = common_options(ap, "override a config key, e.g. --set environment.max_tool_calls=3 (repeatable; YAML value)"
                          ).parse_args()
    store = open_store("reflexdb-cleaner-v0-")
    from reflexdb.config import parse_overrides

    out = new_results(CONFIG)
    overrides = parse_overrides(args.overrides)
    for name in args.settings.split(","):
        r = measure(name, args.groups, store, args.seed, overrides)
        out["results"].append(r)
        print(f"{r['setting']:8} episodes {r['episodes']:3}  code {r['code_rate']:.2f}  calls ok {r['calls_ok']}/"
              f"{r['sandbox_calls']}  errors/episode {r['errors_per_episode']:.2f}  rollbacks {r['rollbacks']} "
              f"recovered {r['recovered']} (shallow {r['shallow']}, deep {r['deep']})  pass@1 {r['pass_at_1']:.3f}  "
              f"groups none/mixed/all {'/'.join(map(str, r['groups_none_mixed_all']))}  "
              f"{r['seconds']} s", flush=True)
        for e in r["error_kinds"][:5]:
            print(f"    {e['count']:3} × {e['kind']}", flush=True)
        write(args.json_out, out)  # after each setting: a cut-short measurement keeps what it measured
    store.close()


if __name__ == "__main__":
    main()
