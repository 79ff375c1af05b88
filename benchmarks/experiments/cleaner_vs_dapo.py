"""CLEANER against DAPO on tool-use episodes, same seed, learner steps and wall-clock budget (docs/experiments.md).

Runs ``reflexdb run --no-eval`` on ``examples/arithmetic-cleaner.yaml`` once per arm and seed, each
in a fresh ``REFLEXDB_HOME`` (embedded PostgreSQL), one after the other, all with the same
``--max-steps`` and ``--max-seconds`` and the same ``--set`` task overrides:

- ``cleaner``: the method as configured (SAAR on every episode, K = 3, γ = 0.5, DAPO on the purified
  trajectories);
- ``dapo``: ``algorithm: dapo`` on the same ``tool_python`` episodes, no rollback (CLEANER's baseline).

Then, in each home: held-out pass@1 of the final policy with tool use and no rollback (``reflexdb
eval --json``: the run's environment, never SAAR), the base model's once per seed; from the
database (view ``cleaner_tool_errors``): tool calls and errors per trajectory per step, raw and as
trained, rollbacks and recoveries. The plot goes to ``--plot`` (docs/cleaner.png).

    python benchmarks/experiments/cleaner_vs_dapo.py --seeds 0,1 --max-steps 12 --max-seconds 600 \\
        --json-out benchmarks/results/cleaner_vs_dapo.json --plot docs/cleaner.png
    python benchmarks/experiments/cleaner_vs_dapo.py --report benchmarks/results/cleaner_vs_dapo.json --plot docs/cleaner.png
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from arms import (CLI, ROOT, eval_json, experiment_parser, home_env, md_table, new_results, output_options,
                  report_or_run, run_logged, run_seeds, save, seed_curves, sql_rows, subplots)

CONFIG = ROOT / "examples" / "arithmetic-cleaner.yaml"
ARMS = {"cleaner": [], "dapo": ["--set", "algorithm=dapo"]}
COLORS = {"cleaner": "tab:red", "dapo": "tab:blue"}
STEPS = """
SELECT step, (metrics->>'reward/pass_at_1')::float8, (metrics->>'reward/mean')::float8,
       extract(epoch FROM created_at - (SELECT min(created_at) FROM policy_versions))
FROM learner_steps ORDER BY step
"""
# per policy version, over the training groups: raw and trained tool calls / errors per trajectory
TOOLS = """
SELECT policy_version, count(*), avg(raw_tool_calls), avg(raw_tool_errors), avg(tool_calls), avg(tool_errors),
       sum(rollbacks), sum(recovered), sum(shallow), sum(deep), avg(reward)
FROM cleaner_tool_errors WHERE group_kind = 'fresh' GROUP BY 1 ORDER BY 1
"""


def run_arm(arm: str, seed: int, max_steps: int, max_seconds: float, extra: list[str], base: dict | None) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"reflexdb-{arm}-{seed}-"))
    env = home_env(home)
    sets = ARMS[arm] + extra + ["--set", f"seed={seed}", "--set", f"run=cleaner-exp-{arm}"]
    load_before = os.getloadavg()[0]
    _, wall = run_logged(CLI + ["run", str(CONFIG), "--no-eval", "--max-steps", str(max_steps), "--max-seconds",
                                str(max_seconds), *sets], env, home / "run.log", f"{arm} seed {seed}")
    base = base or eval_json(env, CONFIG, "base", *sets)
    after = eval_json(env, CONFIG, "latest", *sets)
    steps = sql_rows(env, STEPS)
    tools = sql_rows(env, TOOLS)
    if not os.environ.get("CLEANER_EXP_KEEP"):
        shutil.rmtree(home, ignore_errors=True)
    return {
        "arm": arm, "seed": seed, "sets": extra, "wall_s": round(wall, 1), "steps": len(steps),
        "train_s": round(steps[-1][3]) if steps else None, "base": base, "after": after,
        "step_curve": [{"step": int(s), "pass_at_1": p, "reward": r} for s, p, r, _ in steps],
        "tools_by_version": [dict(zip(("version", "trajectories", "raw_calls", "raw_errors", "calls", "errors",
                                       "rollbacks", "recovered", "shallow", "deep", "reward"), row)) for row in tools],
        "load_before": load_before, "load_after": os.getloadavg()[0],
    }


def report(res: dict) -> str:
    rows = []
    for r in res["arms"]:
        t = r["tools_by_version"]
        first, last = (t[0], t[-1]) if t else ({}, {})
        rb, rec = sum(v["rollbacks"] for v in t), sum(v["recovered"] for v in t)
        rows.append([r["arm"], r["seed"], r["steps"], r["train_s"],
                     f"{r['base']['pass_at_1']:.3f} → {r['after']['pass_at_1']:.3f}",
                     f"{first.get('raw_errors', 0):.2f} → {last.get('raw_errors', 0):.2f}",
                     f"{first.get('errors', 0):.2f} → {last.get('errors', 0):.2f}", f"{rec:.0f} / {rb:.0f}"])
    header = ["arm", "seed", "steps", "training s", "held-out pass@1: base → after",
              "raw tool errors / trajectory (first → last version)", "as trained", "rollbacks recovered / made"]
    return "\n".join(md_table(header, rows, "lrrr"))


def plot(res: dict, path: Path) -> None:
    fig, axes = subplots(3, (14, 3.8))
    seed_curves(axes[0], res, COLORS, "step_curve", "step", "pass_at_1")
    for r in res["arms"]:  # tool errors: every arm's raw episodes, and what CLEANER trained on after purification
        style = "-" if r["seed"] == res["seeds"][0] else ":"
        label = f"{r['arm']} seed {r['seed']}"
        t = r["tools_by_version"]
        axes[1].plot([v["version"] for v in t], [v["raw_errors"] for v in t], style, marker="o", ms=3,
                     color=COLORS[r["arm"]], label=f"{label}, raw")
        if r["arm"] == "cleaner":
            axes[1].plot([v["version"] for v in t], [v["errors"] for v in t], style, marker="x", ms=4,
                         color="black", label=f"{label}, trained (purified)")
    arms = list(dict.fromkeys(r["arm"] for r in res["arms"]))
    for i, arm in enumerate(arms):
        vals = [r["after"]["pass_at_1"] for r in res["arms"] if r["arm"] == arm]
        axes[2].bar(i, sum(vals) / len(vals), 0.6, color=COLORS[arm], alpha=0.8, label=arm)
        axes[2].scatter([i] * len(vals), vals, color="black", s=8, zorder=3)
    bases = [r["base"]["pass_at_1"] for r in res["arms"]]
    axes[2].hlines(sum(bases) / len(bases), -0.5, len(arms) - 0.5, colors="gray", linestyles="--", label="base model")
    axes[0].set(xlabel="learner step", ylabel="batch pass@1", ylim=(0, 1), title="Training batches")
    axes[1].set(xlabel="policy version", ylabel="tool errors per trajectory", title="Tool errors (training groups)")
    axes[2].set(xticks=range(len(arms)), xticklabels=arms, ylim=(0, 1), ylabel="held-out pass@1 (tool use, no rollback)",
                title="Final policy (dots: seeds)")
    for ax in axes:
        ax.legend(fontsize=6)
    save(fig, path, f"SmolLM2-135M, tool-use arithmetic, G = 8, {res['max_steps']} steps or {res['max_seconds']:.0f} s "
                    f"per run ({res['date'][:10]}; from the runs' databases)")


def main() -> None:
    ap = experiment_parser(__doc__, "cleaner,dapo", max_seconds=600)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="a config override for every arm (key=value)")
    args = output_options(ap).parse_args()
    extra = [x for s in args.sets for x in ("--set", s)]
    res = new_results(max_steps=args.max_steps, max_seconds=args.max_seconds,
                      seeds=[int(s) for s in args.seeds.split(",")], sets=args.sets)
    report_or_run(args, lambda: run_seeds(
        res, args.arms.split(","), lambda arm, seed, base: run_arm(arm, seed, args.max_steps, args.max_seconds, extra, base),
        args.json_out, resume=("max_steps", "max_seconds", "sets")), report, plot)


if __name__ == "__main__":
    main()
