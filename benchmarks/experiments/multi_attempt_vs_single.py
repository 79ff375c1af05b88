"""Single-turn against multi-attempt GRPO at the same budget (docs/experiments.md).

Runs ``reflexdb run`` on ``examples/arithmetic-grpo.yaml`` (single: one answer per sample) and on
``examples/arithmetic-multi-attempt.yaml`` (up to K = 3 answers per episode, feedback after a
wrong one): same seed, tasks, sampling, learning rate, 20 learner steps and the same 900-second
learner budget. Each arm in its own fresh ``REFLEXDB_HOME``, one after the other. Then, in that
home, the held-out pass@1 and pass@16 of the base model and of the final policy with one attempt
(``reflexdb run``'s own evaluation) and with K attempts (``reflexdb eval --attempts 3``), and the
training curve from the database: the mean episode reward and the mean attempts per episode of the
groups each policy version collected. The plot goes to ``--plot`` (docs/multi_attempt.png).

    python benchmarks/experiments/multi_attempt_vs_single.py --json-out /tmp/multi.json --plot docs/multi_attempt.png
    python benchmarks/experiments/multi_attempt_vs_single.py --report /tmp/multi.json
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from arms import (CLI, ROOT, eval_json, experiment_parser, home_env, md_table, new_results, output_options,
                  report_or_run, run_logged, run_summary, save, sql_rows, subplots, training)

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
    from reflexdb.config import load_config

    home = Path(tempfile.mkdtemp(prefix=f"reflexdb-{name}-"))
    env = home_env(home)
    load_before = os.getloadavg()[0]
    stdout, wall = run_logged(CLI + ["run", str(config)], env, home / "stderr.log", name, capture=True)
    one = run_summary(stdout, name)
    evals = {checkpoint: eval_json(env, config, checkpoint, "--attempts", str(attempts))
             for checkpoint in ("base", "latest")}
    t = training(env, load_config(config).run)
    curve = [dict(zip(("version", "reward", "solved", "attempts", "first_attempt_right"), row))
             for row in sql_rows(env, CURVE)]
    [[tokens]] = sql_rows(env, "SELECT sum(array_length(response_ids, 1)) FROM token_payloads p JOIN trajectories t "
                               "ON t.id = p.trajectory_id JOIN groups g ON g.id = t.group_id WHERE g.kind = 'fresh'")
    shutil.rmtree(home, ignore_errors=True)
    return {"arm": name, "wall_s": round(wall, 1), "train_s": float(round(t["training_s"])), "steps": int(t["steps"]),
            "response_tokens": int(tokens), "eval_tasks": one["tasks"], "eval_samples": one["samples"],
            "one_attempt": {"base": one["before"], "after": one["after"]},
            "k_attempts": {"base": evals["base"]["pass_at_1"], "after": evals["latest"]["pass_at_1"],
                           "base_pass_at_k": evals["base"]["pass_at_k"], "after_pass_at_k": evals["latest"]["pass_at_k"]},
            "curve": curve, "load_before": load_before, "load_after": os.getloadavg()[0]}


def report(res: dict) -> str:
    rows = []
    for r in res["arms"]:
        a, b = r["one_attempt"], r["k_attempts"]
        rows.append([r["arm"], r["steps"], f"{r['train_s']:.0f}", f"{r['wall_s'] / 60:.1f} min", r["response_tokens"],
                     f"{a['base']:.3f} → {a['after']:.3f} ({100 * (a['after'] - a['base']):+.1f})",
                     f"{b['base']:.3f} → {b['after']:.3f} ({100 * (b['after'] - b['base']):+.1f})"])
    header = ["arm", "steps", "training s", "wall clock", "response tokens", "pass@1, 1 attempt: base → after",
              f"pass@1 within {res['attempts']} attempts: base → after"]
    return "\n".join(md_table(header, rows, "lrrrr"))


def plot(res: dict, path: Path) -> None:
    fig, axes = subplots(2, (10, 3.6))
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
    save(fig, path, f"GRPO, SmolLM2-135M, arithmetic level 1, seed 0 ({res['date'][:10]}; from the runs' databases)")


def main() -> None:
    ap = experiment_parser(__doc__, "single,multi_attempt", seeds=None, max_steps=None)
    ap.add_argument("--attempts", type=int, default=3)
    args = output_options(ap).parse_args()

    def run() -> dict:
        res = new_results(attempts=args.attempts)
        for name in args.arms.split(","):
            print(f"== {name}", flush=True)
            res["arms"].append(run_arm(name, ARMS[name], args.attempts))
            if args.json_out:
                args.json_out.write_text(json.dumps(res, indent=2))
        return res

    report_or_run(args, run, report, plot)


if __name__ == "__main__":
    main()
