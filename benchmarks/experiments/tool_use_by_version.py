"""What a tool-use policy does, version by version: reward, code calls and failed calls per
trajectory, read from the database, for runs of CLEANER and its baseline (docs/experiments.md).

For each named run and each policy version that collected training groups, the trajectories the
policy itself wrote: origin ``base`` in a DAPO run; in a CLEANER run its ``raw`` twins, the
episodes before purification (their turns after a rollback were sampled under the purified
context: docs/cleaner.md, "The raw twin"), falling back to ``base`` when a run has no twins. Counts
come from ``turns``: role ``tool`` turns are calls, those with ``tool_error`` failed calls.

Runs of several databases (one per session or machine) merge into one ``--json-out`` file: each
invocation replaces the runs it read and keeps the others, and the PNG is drawn from the whole
file, runs grouped into arms by name without the seed suffix (as ``reflexdb compare`` does).

    REFLEXDB_HOME=/work/exp20/home python benchmarks/experiments/tool_use_by_version.py dapo-s0 cleaner-s0 \\
        --json-out benchmarks/results/cleaner_fixshot20_tool_use.json --png docs/cleaner_fixshot20_tool_use.png
    python benchmarks/experiments/tool_use_by_version.py --json-out benchmarks/results/cleaner_fixshot20_tool_use.json \\
        --png docs/cleaner_fixshot20_tool_use.png      # only redraw
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from arms import CLI, ROOT, pyplot, save

sys.path.insert(0, str(ROOT))
from reflexdb.ops.compare import arm_of  # noqa: E402

QUERY = """
WITH own AS (
  SELECT r.name, g.policy_version AS version, t.id, t.reward, t.origin,
         bool_or(t.origin = 'raw') OVER (PARTITION BY r.id) AS has_raw
  FROM trajectories t JOIN groups g ON g.id = t.group_id JOIN runs r ON r.id = g.run_id
  WHERE r.name = ANY(string_to_array(:'names', ',')) AND g.kind <> 'eval' AND t.origin IN ('base', 'raw')
)
SELECT o.name, o.version, count(*) AS trajectories, avg(o.reward) AS reward,
       avg((SELECT count(*) FROM turns u WHERE u.trajectory_id = o.id AND u.role = 'tool')) AS calls,
       avg((SELECT count(*) FROM turns u WHERE u.trajectory_id = o.id AND u.role = 'tool' AND u.tool_error))
           AS failed_calls
FROM own o
WHERE o.origin = CASE WHEN o.has_raw THEN 'raw' ELSE 'base' END
GROUP BY 1, 2
ORDER BY 1, 2
"""


def read(names: list[str]) -> dict[str, list[dict]]:
    out = subprocess.run(CLI + ["sql", "--json", " ".join(QUERY.split()), "-v", "names=" + ",".join(names)],
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"reflexdb sql failed: {out.stderr.strip()}")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for row in json.loads(out.stdout):
        runs[row["name"]].append({k: row[k] for k in ("version", "trajectories", "reward", "calls", "failed_calls")})
    missing = [n for n, rows in runs.items() if not rows]
    if missing:
        sys.exit(f"no training trajectories for run(s) {', '.join(missing)} in this database")
    return runs


def plot(runs: dict[str, list[dict]], path: Path, bucket: int) -> None:
    import numpy as np

    plt = pyplot()

    arms: dict[str, list[str]] = {}
    for name in runs:
        arms.setdefault(arm_of(name), []).append(name)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, names) in enumerate(arms.items()):
        for key, ax in zip(("reward", "calls", "failed_calls"), axes):
            per: dict[int, list[float]] = {}
            for name in names:  # each run's versions in buckets, weighted by trajectories
                b: dict[int, list[tuple[float, int]]] = {}
                for row in runs[name]:
                    b.setdefault(row["version"] // bucket, []).append((float(row[key] or 0), row["trajectories"]))
                for k, vals in b.items():
                    per.setdefault(k, []).append(sum(v * n for v, n in vals) / sum(n for _, n in vals))
            ks = sorted(per)
            means = [np.mean(per[k]) for k in ks]
            ax.plot([k * bucket for k in ks], means, "o-", color=colors[i % len(colors)],
                    label=f"{arm} ({len(names)} run{'s' * (len(names) > 1)})")
            for k in ks:
                ax.plot([k * bucket] * len(per[k]), per[k], ".", color=colors[i % len(colors)], alpha=0.35)
    for ax, title in zip(axes, ("batch reward", "code calls per trajectory", "failed calls per trajectory")):
        ax.set_xlabel(f"policy version (buckets of {bucket})")
        ax.set_title(title, fontsize=9)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    save(fig, path, "what the policy wrote (CLEANER: raw episodes, before purification); dots: runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", help="run names in this database (REFLEXDB_HOME / REFLEXDB_DATABASE_URL)")
    ap.add_argument("--json-out", type=Path, required=True, help="merged results file (runs read replace their own)")
    ap.add_argument("--png", type=Path)
    ap.add_argument("--bucket", type=int, default=4, help="policy versions per point of the plot")
    args = ap.parse_args()
    doc = json.loads(args.json_out.read_text()) if args.json_out.exists() else {"runs": {}}
    if args.runs:
        doc["runs"].update(read(args.runs))
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(doc, indent=1) + "\n")
    for name, rows in doc["runs"].items():
        n = sum(r["trajectories"] for r in rows)
        avg = {k: sum(float(r[k] or 0) * r["trajectories"] for r in rows) / n for k in ("reward", "calls", "failed_calls")}
        print(f"{name}: {len(rows)} versions, {n} trajectories, reward {avg['reward']:.3f}, "
              f"calls {avg['calls']:.2f}, failed {avg['failed_calls']:.2f} per trajectory")
    if args.png:
        plot(doc["runs"], args.png, args.bucket)
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
