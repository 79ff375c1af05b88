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

    python benchmarks/experiments/lte_vs_grpo.py --seeds 0,1 --max-steps 12 --max-seconds 480 --json-out /tmp/lte.json --plot docs/lte.png
    python benchmarks/experiments/lte_vs_grpo.py --report /tmp/lte.json --plot docs/lte.png
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from arms import (CLI, ROOT, eval_json, experiment_parser, home_env, md_table, new_results, output_options,
                  report_or_run, run_logged, run_seeds, save, seed_curves, sql_rows, subplots, training)

CONFIG = ROOT / "examples" / "arithmetic-lte.yaml"
# LTE's Eq. 8 normalises by the tokens of the group (1/Z, token-mean), and so does its GRPO (Eq. 2):
# the GRPO arm uses the same aggregation, so the arms differ only in the hint stage.
ARMS = {"grpo": ["--set", "algorithm=grpo", "--set", "learner.loss_params.agg=token-mean"], "lte": [],
        "grpo_extra": ["--set", "lte.mode=extra"]}
COLORS = {"grpo": "tab:blue", "lte": "tab:red", "grpo_extra": "tab:green"}
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
    env = home_env(home)
    run = f"lte-exp-{arm}"
    sets = ARMS[arm] + ["--set", f"seed={seed}", "--set", f"run={run}"]
    load_before = os.getloadavg()[0]
    _, wall = run_logged(CLI + ["run", str(CONFIG), "--max-steps", str(max_steps), "--max-seconds", str(max_seconds),
                                *sets], env, home / "run.log", f"{arm} seed {seed}")
    evals = {checkpoint: eval_json(env, CONFIG, checkpoint, *sets) for checkpoint in ("base", "latest")}
    fresh = sql_rows(env, FRESH_NONE_PASS)
    steps = sql_rows(env, STEPS)
    stages = sql_rows(env, STAGES)[0] if arm != "grpo" else None
    train_s = float(round(training(env, run)["training_s"]))
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
    rows = []
    for r in res["arms"]:
        b, a, f = r["base"], r["after"], r["fresh_none_pass"]
        st = r["stages"]
        stages = "—" if st is None else (f"{st['lte_groups']:.0f} / {st['done']:.0f} ({st['correct']:.0f} / "
                                         f"{st['sampled']:.0f}), {st['released']:.0f} timed out")
        rows.append([r["arm"], r["seed"], r["steps"], f"{r['train_s']:.0f}", f"{r['wall_s'] / 60:.1f} min",
                     f"{b['pass_at_1']:.3f} → {a['pass_at_1']:.3f}", f"{b['pass_at_k']:.3f} → {a['pass_at_k']:.3f}",
                     f"{f[0]['none_pass']:.2f} → {f[-1]['none_pass']:.2f}", stages])
    header = ["arm", "seed", "steps", "training s", "wall clock", "pass@1: base → after",
              f"pass@{res['samples']}: base → after", "none-pass, fresh groups: first → last version",
              "hint stages: LTE groups / done (extra right / sampled)"]
    return "\n".join(md_table(header, rows, "lrrrr"))


def plot(res: dict, path: Path) -> None:
    fig, axes = subplots(2, (11, 3.8))
    seed_curves(axes[0], res, COLORS, "fresh_none_pass", "version", "none_pass")
    seed_curves(axes[1], res, COLORS, "step_curve", "step", "none_pass_after", div=res.get("groups_per_step", 4))
    axes[0].set(xlabel="policy version that sampled the group", ylabel="none-pass fraction", ylim=(0, 1),
                title="Fresh groups with no correct rollout")
    axes[1].set(xlabel="learner step", ylabel="none-pass fraction of the batch", ylim=(0, 1),
                title="Batches after hinting (LTE groups replace originals)")
    axes[0].legend(fontsize=7)
    save(fig, path, f"SmolLM2-135M, arithmetic levels 1 and 2, G = 8, {res['max_seconds']:.0f} s of learner time per run "
                    f"({res['date'][:10]}; from the runs' databases)")


def main() -> None:
    ap = experiment_parser(__doc__, "lte,grpo_extra,grpo", max_seconds=480)
    ap.add_argument("--samples", type=int, default=16, help="learner.eval_samples of the config (for the table)")
    args = output_options(ap).parse_args()
    res = new_results(max_steps=args.max_steps, max_seconds=args.max_seconds, samples=args.samples,
                      seeds=[int(s) for s in args.seeds.split(",")])
    # every arm evaluates the base model itself, and a new invocation starts over (no resume)
    report_or_run(args, lambda: run_seeds(
        res, args.arms.split(","), lambda arm, seed, _base: run_arm(arm, seed, args.max_steps, args.max_seconds),
        args.json_out), report, plot)


if __name__ == "__main__":
    main()
