"""R3L against GRPO and OPMD at the same seed, learner steps and wall-clock budget (docs/experiments.md).

Runs ``reflexdb run --no-eval`` on ``examples/arithmetic-r3l.yaml`` (multi-attempt arithmetic, levels 1 and 2,
N = G = 8) once per arm and seed, each in a fresh ``REFLEXDB_HOME`` (embedded PostgreSQL),
one after the other, all with the same ``--max-steps`` and ``--max-seconds``:

- ``r3l``: the method as configured (reflect-then-retry, pivotal mask, positive amplification, SFT);
- ``grpo``: ``algorithm: grpo`` on the same task and budget (G = 8 fresh episodes per task);
- ``opmd``: ``algorithm: opmd``, R3L's loss (−A·log π, no ratio, no KL) without reflect/retry;
- ``r3l_no_amp``, ``r3l_no_pivot``: the paper's ablations (``r3l.amplification: false``,
  ``r3l.pivot_mask: false``), when asked for with ``--arms``.

Then, in each home: held-out pass@1 of the final policy with one attempt and the plain prompt, and
solved within 3 attempts (``reflexdb eval --json``, ``--attempts 3``); the base model's once per
seed (the same weights in every arm). From the database: each step's batch pass@1 (base episodes
only) and, for the R3L arms, the reflections' validity, outcomes, the retries and how many improved.
The plot goes to ``--plot`` (docs/r3l.png).

    python benchmarks/experiments/r3l_vs_grpo.py --seeds 0,1 --max-steps 12 --max-seconds 900 \\
        --json-out benchmarks/results/r3l_vs_grpo.json --plot docs/r3l.png
    python benchmarks/experiments/r3l_vs_grpo.py --report benchmarks/results/r3l_vs_grpo.json --plot docs/r3l.png
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from arms import (CLI, ROOT, eval_json, experiment_parser, home_env, md_table, new_results, output_options,
                  report_or_run, run_logged, run_seeds, save, seed_curves, sql_rows, subplots)

CONFIG = ROOT / "examples" / "arithmetic-r3l.yaml"
ARMS = {"r3l": [], "grpo": ["--set", "algorithm=grpo"], "opmd": ["--set", "algorithm=opmd"],
        "r3l_no_amp": ["--set", "r3l.amplification=false"], "r3l_no_pivot": ["--set", "r3l.pivot_mask=false"]}
COLORS = {"r3l": "tab:red", "grpo": "tab:blue", "opmd": "tab:green", "r3l_no_amp": "tab:orange",
          "r3l_no_pivot": "tab:purple"}
STEPS = """
SELECT step, (metrics->>'reward/pass_at_1')::float8, (metrics->>'reward/mean')::float8,
       coalesce((metrics->>'r3l/retry_improvement_rate')::float8, -1), coalesce((metrics->>'r3l/invalid_rate')::float8, -1),
       extract(epoch FROM created_at - (SELECT min(created_at) FROM policy_versions))
FROM learner_steps ORDER BY step
"""
REFLECTIONS = """
SELECT count(*), count(*) FILTER (WHERE valid), count(*) FILTER (WHERE outcome = 'success'),
       count(*) FILTER (WHERE outcome = 'success_but_inefficient'), count(*) FILTER (WHERE outcome = 'failure'),
       count(retry_trajectory_id), count(*) FILTER (WHERE improved), coalesce(avg(pivot) FILTER (WHERE retry_trajectory_id IS NOT NULL), -1),
       coalesce(avg(base_reward), -1), coalesce(avg(retry_reward), -1),
       (SELECT count(*) FROM r3l_reflect_set), (SELECT coalesce(sum(times_sampled), 0) FROM r3l_reflect_set)
FROM r3l_reflections
"""


def _evals(env: dict, sets: list[str], checkpoint: str) -> dict:
    """Held-out pass@1 with one attempt and solved within 3 attempts, plain prompt."""
    return {f"attempts_{n}": eval_json(env, CONFIG, checkpoint, "--attempts", str(n), *sets) for n in (1, 3)}


def run_arm(arm: str, seed: int, max_steps: int, max_seconds: float, base: dict | None) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"reflexdb-{arm}-{seed}-"))
    env = home_env(home)
    sets = ARMS[arm] + ["--set", f"seed={seed}", "--set", f"run=r3l-exp-{arm}"]
    load_before = os.getloadavg()[0]
    _, wall = run_logged(CLI + ["run", str(CONFIG), "--no-eval", "--max-steps", str(max_steps), "--max-seconds",
                                str(max_seconds), *sets], env, home / "run.log", f"{arm} seed {seed}")
    if base is None:
        base = _evals(env, sets, "base")
    after = _evals(env, sets, "latest")
    steps = sql_rows(env, STEPS)
    refl = sql_rows(env, REFLECTIONS)[0] if arm.startswith("r3l") else None
    examples = _examples(env) if arm.startswith("r3l") else []
    [[groups, trajectories]] = sql_rows(env, "SELECT count(DISTINCT group_id), count(*) FROM trajectories t "
                                             "JOIN groups g ON g.id = t.group_id WHERE g.kind <> 'eval'")
    keep = os.environ.get("R3L_EXP_KEEP")
    if not keep:
        shutil.rmtree(home, ignore_errors=True)
    return {
        "arm": arm, "seed": seed, "wall_s": round(wall, 1), "steps": len(steps),
        "train_s": round(steps[-1][5]) if steps else None, "base": base, "after": after,
        "groups": int(groups), "trajectories": int(trajectories),
        "step_curve": [{"step": int(s), "pass_at_1": p, "reward": r, "improvement_rate": i, "invalid_rate": v}
                       for s, p, r, i, v, _ in steps],
        "reflections": None if refl is None else dict(zip(
            ("n", "valid", "success", "success_but_inefficient", "failure", "retries", "improved", "mean_pivot",
             "base_reward", "retry_reward", "reflect_pairs", "reflect_uses"), refl)),
        "examples": examples,
        "load_before": load_before, "load_after": os.getloadavg()[0], "home": str(home) if keep else None,
    }


def _examples(env: dict) -> list[dict]:
    """A few stored reflections of the last policy versions (view r3l_reflections)."""
    query = ("SELECT encode(convert_to(coalesce(json_agg(x), '[]')::text, 'UTF8'), 'hex') FROM ("
             "SELECT reflection_id, policy_version, valid, outcome, pivot, base_reward, retry_reward, "
             "left(raw_text, 400) AS text FROM r3l_reflections ORDER BY policy_version DESC, "
             "(outcome = 'failure') DESC, reflection_id LIMIT 4) x")
    out = subprocess.run(CLI + ["sql", "--max-width", "0", query], env=env, capture_output=True, text=True)
    try:
        cell = out.stdout.strip().splitlines()[2].strip(" |")
        return json.loads(bytes.fromhex(cell).decode())
    except (ValueError, IndexError):
        return [{"error": (out.stderr or out.stdout).strip()[-300:]}]


def report(res: dict) -> str:
    rows = []
    for r in res["arms"]:
        b, a, f = r["base"], r["after"], r["reflections"]
        refl = "—" if f is None else f"{f['valid']:.0f} / {f['n']:.0f}"
        retr = "—" if f is None else f"{f['improved']:.0f} / {f['retries']:.0f}"
        rows.append([r["arm"], r["seed"], r["steps"], r["train_s"],
                     f"{b['attempts_1']['pass_at_1']:.3f} → {a['attempts_1']['pass_at_1']:.3f}",
                     f"{b['attempts_3']['pass_at_1']:.3f} → {a['attempts_3']['pass_at_1']:.3f}", refl, retr])
    header = ["arm", "seed", "steps", "training s", "pass@1 (1 attempt): base → after", "within 3 attempts: base → after",
              "reflections valid / all", "retries improved / made"]
    return "\n".join(md_table(header, rows, "lrrr"))


def plot(res: dict, path: Path) -> None:
    fig, axes = subplots(2, (11, 3.8))
    arms = list(dict.fromkeys(r["arm"] for r in res["arms"]))
    seed_curves(axes[0], res, COLORS, "step_curve", "step", "pass_at_1")
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        runs = [r for r in res["arms"] if r["arm"] == arm]
        for j, key in enumerate(("attempts_1", "attempts_3")):
            vals = [r["after"][key]["pass_at_1"] for r in runs]
            x = j + (i - (len(arms) - 1) / 2) * width
            axes[1].bar(x, sum(vals) / len(vals), width, color=COLORS[arm], alpha=0.8,
                        label=arm if j == 0 else None)
            axes[1].scatter([x] * len(vals), vals, color="black", s=8, zorder=3)
    bases = {key: sum(r["base"][key]["pass_at_1"] for r in res["arms"]) / len(res["arms"])
             for key in ("attempts_1", "attempts_3")}
    for j, key in enumerate(("attempts_1", "attempts_3")):
        axes[1].hlines(bases[key], j - 0.45, j + 0.45, colors="gray", linestyles="--",
                       label="base model" if j == 0 else None)
    axes[0].set(xlabel="learner step", ylabel="batch pass@1 (the policy's own episodes)", ylim=(0, 1),
                title="Training batches")
    axes[1].set(xticks=[0, 1], xticklabels=["pass@1, one attempt", "solved within 3 attempts"], ylim=(0, 1),
                ylabel="held-out (8 problems × 16 samples)", title="Final policy, plain prompt (dots: seeds)")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    save(fig, path, f"SmolLM2-135M, multi-attempt sums (levels 1, 2), N = 8, {res['max_steps']} steps or "
                    f"{res['max_seconds']:.0f} s per run ({res['date'][:10]}; from the runs' databases)")


def main() -> None:
    ap = experiment_parser(__doc__, "r3l,grpo,opmd", max_seconds=900)
    args = output_options(ap).parse_args()
    res = new_results(max_steps=args.max_steps, max_seconds=args.max_seconds, seeds=[int(s) for s in args.seeds.split(",")])
    report_or_run(args, lambda: run_seeds(
        res, args.arms.split(","), lambda arm, seed, base: run_arm(arm, seed, args.max_steps, args.max_seconds, base),
        args.json_out, resume=("max_steps", "max_seconds")), report, plot)


if __name__ == "__main__":
    main()
