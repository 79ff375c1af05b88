"""Single-turn against multi-attempt GRPO at the same budget (docs/experiments.md).

Runs ``reflexdb run`` on ``examples/arithmetic-grpo.yaml`` (single: one answer per sample) and on
``examples/arithmetic-multi-attempt.yaml`` (up to K = 3 answers per episode, feedback after a
wrong one): same seed, tasks, sampling, learning rate, 20 learner steps and the same 900-second
learner budget. Each arm in its own fresh ``REFLEXDB_HOME``, one after the other. Then, in that
home, the held-out pass@1 and pass@16 of the base model and of the final policy with one attempt
(``reflexdb run``'s own evaluation) and with K attempts (``reflexdb eval --attempts 3``), and the
training curve from the database: the mean episode reward and the mean attempts per episode of the
groups each policy version collected. The plot goes to ``--plot`` (docs/multi_attempt.png).

    python benchmarks/multi_attempt_vs_single.py --json-out /tmp/multi.json --plot docs/multi_attempt.png
    python benchmarks/multi_attempt_vs_single.py --report /tmp/multi.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "reflexdb.cli.main"]
SUMMARY = re.compile(r"held-out pass@1 \((\d+) \S+ tasks x (\d+) samples\): (\S+) ([\d.]+) -> (\S+) ([\d.]+)")
ARMS = {"single": ROOT / "examples" / "arithmetic-grpo.yaml",
        "multi_attempt": ROOT / "examples" / "arithmetic-multi-attempt.yaml"}
CURVE = """
SELECT g.policy_version, avg(t.reward) AS reward, avg(t.correct::int) AS solved,
       avg(coalesce((t.meta->>'attempts')::int, 1)) AS attempts,
       avg((SELECT u.correct::int FROM turns u WHERE u.trajectory_id = t.id AND u.role = 'assistant'
            ORDER BY u.turn_index LIMIT 1)) AS first_attempt_right
FROM trajectories t JOIN groups g ON g.id = t.group_id
WHERE g.kind = 'fresh' GROUP BY 1 ORDER BY 1
"""


def run_arm(name: str, config: Path, attempts: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"reflexdb-{name}-"))
    env = {k: v for k, v in os.environ.items() if k not in ("REFLEXDB_DATABASE_URL", "OMP_NUM_THREADS")}
    env.update(REFLEXDB_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    with open(home / "stderr.log", "w") as err:
        proc = subprocess.run(CLI + ["run", str(config)], env=env, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}; see {home / 'stderr.log'}")
    m = SUMMARY.search(proc.stdout)
    if not m:
        raise SystemExit(f"{name}: no summary in the output:\n{proc.stdout}")
    evals = {}
    for checkpoint in ("base", "latest"):
        out = subprocess.run(CLI + ["eval", "-c", str(config), "--checkpoint", checkpoint, "--attempts", str(attempts),
                                    "--json"], env=env, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise SystemExit(f"{name}: eval {checkpoint} failed:\n{out.stderr}")
        evals[checkpoint] = json.loads(out.stdout.strip().splitlines()[-1])

    def sql(query: str) -> list[list[str]]:
        """Rows of `reflexdb sql`'s table (header, rule, rows, "(n rows)"), NULL as "0"."""
        out = subprocess.run(CLI + ["sql", "--max-width", "0", query], env=env, capture_output=True, text=True,
                             check=True).stdout
        lines = out.strip().splitlines()[2:-1]
        return [[c.strip() or "0" for c in line.split("|")] for line in lines]

    [[train_s, steps]] = sql("SELECT round(extract(epoch FROM max(s.created_at) - min(p.created_at))), max(s.step) "
                             "FROM learner_steps s JOIN policy_versions p ON p.run_id = s.run_id AND p.version = 0")
    curve = [dict(zip(("version", "reward", "solved", "attempts", "first_attempt_right"), map(float, row)))
             for row in sql(" ".join(CURVE.split()))]
    [[tokens]] = sql("SELECT sum(array_length(response_ids, 1)) FROM token_payloads p JOIN trajectories t "
                     "ON t.id = p.trajectory_id JOIN groups g ON g.id = t.group_id WHERE g.kind = 'fresh'")
    shutil.rmtree(home, ignore_errors=True)
    return {"arm": name, "wall_s": round(wall, 1), "train_s": float(train_s), "steps": int(steps),
            "response_tokens": int(tokens or 0), "eval_tasks": int(m.group(1)), "eval_samples": int(m.group(2)),
            "one_attempt": {"base": float(m.group(4)), "after": float(m.group(6))},
            "k_attempts": {"base": evals["base"]["pass_at_1"], "after": evals["latest"]["pass_at_1"],
                           "base_pass_at_k": evals["base"]["pass_at_k"], "after_pass_at_k": evals["latest"]["pass_at_k"]},
            "curve": curve, "load_before": load_before, "load_after": os.getloadavg()[0]}


def report(res: dict) -> str:
    k = res["attempts"]
    out = [f"| arm | steps | training s | wall clock | response tokens | pass@1, 1 attempt: base → after | "
           f"pass@1 within {k} attempts: base → after |", "|---|---:|---:|---:|---:|---|---|"]
    for r in res["arms"]:
        a, b = r["one_attempt"], r["k_attempts"]
        out.append(f"| {r['arm']} | {r['steps']} | {r['train_s']:.0f} | {r['wall_s'] / 60:.1f} min | {r['response_tokens']} | "
                   f"{a['base']:.3f} → {a['after']:.3f} ({100 * (a['after'] - a['base']):+.1f}) | "
                   f"{b['base']:.3f} → {b['after']:.3f} ({100 * (b['after'] - b['base']):+.1f}) |")
    return "\n".join(out)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in res["arms"]:
        v = [c["version"] for c in r["curve"]]
        axes[0].plot(v, [c["first_attempt_right"] for c in r["curve"]], marker="o", label=f"{r['arm']}: first answer right")
        if r["arm"] != "single":
            axes[0].plot(v, [c["solved"] for c in r["curve"]], marker="s", ls="--", label=f"{r['arm']}: solved within K")
            axes[1].plot(v, [c["attempts"] for c in r["curve"]], marker="o", label=r["arm"])
    axes[0].set(xlabel="policy version that collected the group", ylabel="share of training samples", ylim=(0, 1),
                title="Training samples over policy versions")
    axes[1].set(xlabel="policy version", ylabel="attempts per episode", title="Multi-attempt: attempts used")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"GRPO, SmolLM2-135M, arithmetic level 1, seed 0 ({res['date'][:10]}; from the runs' databases)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="single,multi_attempt")
    ap.add_argument("--attempts", type=int, default=3)
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--report", type=Path, help="print the table of a results file (and plot it) and exit")
    args = ap.parse_args()
    if args.report:
        res = json.loads(args.report.read_text())
    else:
        res = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "attempts": args.attempts,
               "machine": f"{os.cpu_count()} cores", "arms": []}
        for name in args.arms.split(","):
            print(f"== {name}", flush=True)
            res["arms"].append(run_arm(name, ARMS[name], args.attempts))
            if args.json_out:
                args.json_out.write_text(json.dumps(res, indent=2))
    print(report(res))
    if args.plot:
        plot(res, args.plot)


if __name__ == "__main__":
    main()
