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

    python benchmarks/r3l_vs_grpo.py --seeds 0,1 --max-steps 12 --max-seconds 900 \\
        --json-out benchmarks/results/r3l_vs_grpo.json --plot docs/r3l.png
    python benchmarks/r3l_vs_grpo.py --report benchmarks/results/r3l_vs_grpo.json --plot docs/r3l.png
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
CONFIG = ROOT / "examples" / "arithmetic-r3l.yaml"
ARMS = {"r3l": [], "grpo": ["--set", "algorithm=grpo"], "opmd": ["--set", "algorithm=opmd"],
        "r3l_no_amp": ["--set", "r3l.amplification=false"], "r3l_no_pivot": ["--set", "r3l.pivot_mask=false"]}
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


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("REFLEXDB_DATABASE_URL", "OMP_NUM_THREADS")}
    return dict(env, REFLEXDB_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def _eval(env: dict, sets: list[str], checkpoint: str, attempts: int) -> dict:
    out = subprocess.run(CLI + ["eval", "-c", str(CONFIG), "--checkpoint", checkpoint, "--json",
                                "--attempts", str(attempts), *sets], env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"eval {checkpoint} (attempts {attempts}) failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sql(env: dict, query: str) -> list[list[float]]:
    out = subprocess.run(CLI + ["sql", "--max-width", "0", " ".join(query.split())],
                         env=env, capture_output=True, text=True, check=True).stdout
    return [[float(c.strip() or 0) for c in line.split("|")] for line in out.strip().splitlines()[2:-1]]


def run_arm(arm: str, seed: int, max_steps: int, max_seconds: float, base: dict | None) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"reflexdb-{arm}-{seed}-"))
    env = _env(home)
    sets = ARMS[arm] + ["--set", f"seed={seed}", "--set", f"run=r3l-exp-{arm}"]
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    with open(home / "run.log", "w") as log:
        proc = subprocess.run(CLI + ["run", str(CONFIG), "--no-eval", "--max-steps", str(max_steps), "--max-seconds",
                                     str(max_seconds), *sets], env=env, stdout=log, stderr=subprocess.STDOUT,
                              text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{arm} seed {seed}: exit {proc.returncode}; see {home / 'run.log'}")
    if base is None:
        base = {"attempts_1": _eval(env, sets, "base", 1), "attempts_3": _eval(env, sets, "base", 3)}
    after = {"attempts_1": _eval(env, sets, "latest", 1), "attempts_3": _eval(env, sets, "latest", 3)}
    steps = _sql(env, STEPS)
    refl = _sql(env, REFLECTIONS)[0] if arm.startswith("r3l") else None
    examples = _examples(env) if arm.startswith("r3l") else []
    [[groups, trajectories]] = _sql(env, "SELECT count(DISTINCT group_id), count(*) FROM trajectories t "
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
    out = ["| arm | seed | steps | training s | pass@1 (1 attempt): base → after | within 3 attempts: base → after | "
           "reflections valid / all | retries improved / made |", "|---|---:|---:|---:|---|---|---|---|"]
    for r in res["arms"]:
        b, a, f = r["base"], r["after"], r["reflections"]
        refl = "—" if f is None else f"{f['valid']:.0f} / {f['n']:.0f}"
        retr = "—" if f is None else f"{f['improved']:.0f} / {f['retries']:.0f}"
        out.append(f"| {r['arm']} | {r['seed']} | {r['steps']} | {r['train_s']} | "
                   f"{b['attempts_1']['pass_at_1']:.3f} → {a['attempts_1']['pass_at_1']:.3f} | "
                   f"{b['attempts_3']['pass_at_1']:.3f} → {a['attempts_3']['pass_at_1']:.3f} | {refl} | {retr} |")
    return "\n".join(out)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"r3l": "tab:red", "grpo": "tab:blue", "opmd": "tab:green", "r3l_no_amp": "tab:orange",
              "r3l_no_pivot": "tab:purple"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    arms = list(dict.fromkeys(r["arm"] for r in res["arms"]))
    for r in res["arms"]:
        style = "-" if r["seed"] == res["seeds"][0] else ":"
        s = r["step_curve"]
        axes[0].plot([c["step"] for c in s], [c["pass_at_1"] for c in s], style, marker="o", ms=3,
                     color=colors[r["arm"]], label=f"{r['arm']} seed {r['seed']}")
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        runs = [r for r in res["arms"] if r["arm"] == arm]
        for j, key in enumerate(("attempts_1", "attempts_3")):
            vals = [r["after"][key]["pass_at_1"] for r in runs]
            x = j + (i - (len(arms) - 1) / 2) * width
            axes[1].bar(x, sum(vals) / len(vals), width, color=colors[arm], alpha=0.8,
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
    fig.suptitle(f"SmolLM2-135M, multi-attempt sums (levels 1, 2), N = 8, {res['max_steps']} steps or "
                 f"{res['max_seconds']:.0f} s per run ({res['date'][:10]}; from the runs' databases)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="r3l,grpo,opmd")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--report", type=Path, help="print the table of a results file (and plot it) and exit")
    args = ap.parse_args()
    if args.report:
        res = json.loads(args.report.read_text())
    else:
        seeds = [int(s) for s in args.seeds.split(",")]
        res = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "machine": f"{os.cpu_count()} cores",
               "max_steps": args.max_steps, "max_seconds": args.max_seconds, "seeds": seeds, "arms": []}
        if args.json_out and args.json_out.exists():  # resume an interrupted experiment
            done = json.loads(args.json_out.read_text())
            if (done["max_steps"], done["max_seconds"]) == (args.max_steps, args.max_seconds):
                res = done
        for seed in seeds:  # a seed's arms first: a cut-short experiment still compares like with like
            base = next((r["base"] for r in res["arms"] if r["seed"] == seed), None)
            for arm in args.arms.split(","):
                if any(r["arm"] == arm and r["seed"] == seed for r in res["arms"]):
                    continue
                print(f"== {arm} seed {seed}", flush=True)
                r = run_arm(arm, seed, args.max_steps, args.max_seconds, base)
                base = r["base"]
                res["arms"].append(r)
                if args.json_out:
                    args.json_out.write_text(json.dumps(res, indent=2))
    print(report(res))
    if args.plot:
        plot(res, args.plot)


if __name__ == "__main__":
    main()
