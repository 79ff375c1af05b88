"""LTE against GRPO and GRPO_Extra at the same seed, steps and wall-clock budget (docs/experiments.md).

Runs ``reflexdb run`` on ``examples/arithmetic-lte.yaml`` three ways — ``grpo`` (algorithm grpo,
token-mean aggregation like LTE's Eq. 8),
``lte`` (hints), ``grpo_extra`` (``lte.mode: extra``: the same extra rollouts with the plain
prompt) — for each seed, each in its own fresh ``REFLEXDB_HOME`` (embedded PostgreSQL), one after
the other, all with the same ``--max-steps`` and ``--max-seconds``. Then, in that home, the
held-out pass@1 and pass@k with the plain prompt of the base model and of the final policy
(``reflexdb eval --json``), and from the database: the none-pass fraction of the fresh groups each
policy version sampled, the none-pass fraction of each learner step's batch (after hinting) and,
for the LTE arms, the hint stages' outcomes. The plot goes to ``--plot`` (docs/lte.png).

    python benchmarks/lte_vs_grpo.py --seeds 0,1 --max-steps 12 --max-seconds 480 --json-out /tmp/lte.json --plot docs/lte.png
    python benchmarks/lte_vs_grpo.py --report /tmp/lte.json --plot docs/lte.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "reflexdb.cli.main"]
CONFIG = ROOT / "examples" / "arithmetic-lte.yaml"
# LTE's Eq. 8 normalises by the tokens of the group (1/Z, token-mean), and so does its GRPO (Eq. 2):
# the GRPO arm uses the same aggregation, so the arms differ only in the hint stage.
ARMS = {"grpo": ["--set", "algorithm=grpo", "--set", "learner.loss_params.agg=token-mean"], "lte": [],
        "grpo_extra": ["--set", "lte.mode=extra"]}
FRESH_NONE_PASS = """
SELECT g.policy_version, avg((NOT EXISTS (SELECT 1 FROM trajectories t WHERE t.group_id = g.id AND t.correct))::int),
       count(*) FROM groups g WHERE g.kind = 'fresh' GROUP BY 1 ORDER BY 1
"""
STEPS = """
SELECT step, (metrics->>'groups/none_pass')::float8, coalesce((metrics->>'lte/none_pass_before')::float8, -1),
       coalesce((metrics->>'lte/lte_groups')::float8, 0), (metrics->>'reward/pass_at_1')::float8
FROM learner_steps ORDER BY step
"""
STAGES = """
SELECT count(*), count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'released'),
       coalesce(sum(n_correct), 0), coalesce(sum(n_sampled), 0), count(*) FILTER (WHERE lte_group_id IS NOT NULL),
       coalesce(round(avg(extract(epoch FROM s.completed_at - g.created_at))::numeric, 1), 0)
FROM lte_stages s JOIN groups g ON g.id = s.group_id
"""


def run_arm(arm: str, seed: int, max_steps: int, max_seconds: float) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"reflexdb-{arm}-{seed}-"))
    env = {k: v for k, v in os.environ.items() if k not in ("REFLEXDB_DATABASE_URL", "OMP_NUM_THREADS")}
    env.update(REFLEXDB_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    sets = ARMS[arm] + ["--set", f"seed={seed}", "--set", f"run=lte-exp-{arm}"]
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    with open(home / "run.log", "w") as log:
        proc = subprocess.run(CLI + ["run", str(CONFIG), "--max-steps", str(max_steps), "--max-seconds",
                                     str(max_seconds), *sets], env=env, stdout=log, stderr=subprocess.STDOUT,
                              text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{arm} seed {seed}: exit {proc.returncode}; see {home / 'run.log'}")
    evals = {}
    for checkpoint in ("base", "latest"):
        out = subprocess.run(CLI + ["eval", "-c", str(CONFIG), "--checkpoint", checkpoint, "--json", *sets], env=env, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise SystemExit(f"{arm} seed {seed}: eval {checkpoint} failed:\n{out.stderr}")
        evals[checkpoint] = json.loads(out.stdout.strip().splitlines()[-1])

    def sql(query: str) -> list[list[float]]:
        out = subprocess.run(CLI + ["sql", "--max-width", "0", " ".join(query.split())],
                             env=env, capture_output=True, text=True, check=True).stdout
        return [[float(c.strip() or 0) for c in line.split("|")] for line in out.strip().splitlines()[2:-1]]

    fresh = sql(FRESH_NONE_PASS)
    steps = sql(STEPS)
    stages = sql(STAGES)[0] if arm != "grpo" else None
    [[train_s]] = sql("SELECT round(extract(epoch FROM max(s.created_at) - min(p.created_at))) "
                      "FROM learner_steps s JOIN policy_versions p ON p.run_id = s.run_id AND p.version = 0")
    keep = os.environ.get("LTE_EXP_KEEP")
    if not keep:
        shutil.rmtree(home, ignore_errors=True)
    return {
        "arm": arm, "seed": seed, "wall_s": round(wall, 1), "train_s": train_s, "steps": len(steps),
        "base": evals["base"], "after": evals["latest"],
        "fresh_none_pass": [{"version": int(v), "none_pass": p, "groups": int(n)} for v, p, n in fresh],
        "step_curve": [{"step": int(s), "none_pass_after": a, "none_pass_before": b, "lte_groups": g, "pass_at_1": p}
                       for s, a, b, g, p in steps],
        "stages": None if stages is None else dict(zip(
            ("opened", "done", "released", "correct", "sampled", "lte_groups", "latency_s"), stages)),
        "load_before": load_before, "load_after": os.getloadavg()[0], "home": str(home) if keep else None,
    }


def report(res: dict) -> str:
    k = res["samples"]
    out = [f"| arm | seed | steps | training s | wall clock | pass@1: base → after | pass@{k}: base → after | "
           "none-pass, fresh groups: first → last version | hint stages: LTE groups / done (extra right / sampled) |",
           "|---|---:|---:|---:|---:|---|---|---|---|"]
    for r in res["arms"]:
        b, a, f = r["base"], r["after"], r["fresh_none_pass"]
        st = r["stages"]
        stages = "—" if st is None else (f"{st['lte_groups']:.0f} / {st['done']:.0f} ({st['correct']:.0f} / "
                                         f"{st['sampled']:.0f}), {st['released']:.0f} timed out")
        out.append(f"| {r['arm']} | {r['seed']} | {r['steps']} | {r['train_s']:.0f} | {r['wall_s'] / 60:.1f} min | "
                   f"{b['pass_at_1']:.3f} → {a['pass_at_1']:.3f} | {b['pass_at_k']:.3f} → {a['pass_at_k']:.3f} | "
                   f"{f[0]['none_pass']:.2f} → {f[-1]['none_pass']:.2f} | {stages} |")
    return "\n".join(out)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"grpo": "tab:blue", "lte": "tab:red", "grpo_extra": "tab:green"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for r in res["arms"]:
        style = "-" if r["seed"] == res["seeds"][0] else ":"
        f = r["fresh_none_pass"]
        axes[0].plot([c["version"] for c in f], [c["none_pass"] for c in f], style, marker="o", ms=3,
                     color=colors[r["arm"]], label=f"{r['arm']} seed {r['seed']}")
        s = r["step_curve"]
        G = res.get("groups_per_step", 4)
        axes[1].plot([c["step"] for c in s], [c["none_pass_after"] / G for c in s], style, marker="o", ms=3,
                     color=colors[r["arm"]], label=f"{r['arm']} seed {r['seed']}")
    axes[0].set(xlabel="policy version that sampled the group", ylabel="none-pass fraction", ylim=(0, 1),
                title="Fresh groups with no correct rollout")
    axes[1].set(xlabel="learner step", ylabel="none-pass fraction of the batch", ylim=(0, 1),
                title="Batches after hinting (LTE groups replace originals)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"SmolLM2-135M, arithmetic levels 1 and 2, G = 8, {res['max_seconds']:.0f} s of learner time per run "
                 f"({res['date'][:10]}; from the runs' databases)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="lte,grpo_extra,grpo")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--max-seconds", type=float, default=480)
    ap.add_argument("--samples", type=int, default=16, help="learner.eval_samples of the config (for the table)")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--report", type=Path, help="print the table of a results file (and plot it) and exit")
    args = ap.parse_args()
    if args.report:
        res = json.loads(args.report.read_text())
    else:
        seeds = [int(s) for s in args.seeds.split(",")]
        res = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "machine": f"{os.cpu_count()} cores",
               "max_steps": args.max_steps, "max_seconds": args.max_seconds, "samples": args.samples,
               "seeds": seeds, "arms": []}
        for seed in seeds:  # a seed's three arms first: a cut-short run still compares like with like
            for arm in args.arms.split(","):
                print(f"== {arm} seed {seed}", flush=True)
                res["arms"].append(run_arm(arm, seed, args.max_steps, args.max_seconds))
                if args.json_out:
                    args.json_out.write_text(json.dumps(res, indent=2))
    print(report(res))
    if args.plot:
        plot(res, args.plot)


if __name__ == "__main__":
    main()
