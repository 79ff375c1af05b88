"""Diagnostic arms against their baseline, every run in one database, compared with ``reflexdb compare``.

Each arm and seed runs what a user types, ``reflexdb run CONFIG --set run=ARM-sSEED --set seed=SEED
--max-steps N --max-seconds S`` (held-out pass@1 before and after, plain prompt), one after the
other, all in one ``REFLEXDB_HOME`` (one embedded PostgreSQL), so that ``reflexdb compare`` reads
them together. The seeds go in turn, each seed's arms one after the other (a cut-short experiment
still compares like with like); a run already in the results file is skipped, so the script
resumes. Each run's processes are polled for their peak resident memory (benchmarks/memory_bench.py).

Experiments (``--experiment``):

- ``r3l-oracle``: ``examples/arithmetic-r3l.yaml`` (multi-attempt sums, levels 1-2, N = G = 8) with
  ``r3l.guidance: oracle`` (docs/r3l.md) against ``algorithm: grpo`` on the same task and budget.
- ``cleaner-fixshot``: ``examples/arithmetic-cleaner.yaml`` (SAAR rollback) against its baseline
  ``examples/arithmetic-tool-dapo.yaml`` (the same episodes, no rollback), both at level 9 under the
  ``tool_python_fix_shot`` prompt, whose worked exchange fails a call and fixes it (docs/cleaner.md).

Run it from a frozen copy of the code::

    python benchmarks/experiments/diagnostic_arms.py --experiment r3l-oracle --seeds 0,1,2 --max-steps 20 \\
        --max-seconds 1000 --set learner.keep_policies=null --home /work/exp-home \\
        --json-out benchmarks/results/r3l_oracle_1000.json
    # the same command with --eval-at 7 (docs/experiments.md), then:
    reflexdb compare grpo-s0 r3l-oracle-s0 grpo-s1 ... --png docs/r3l_oracle.png   # REFLEXDB_HOME=/work/exp-home

At equal steps: run with ``--set learner.keep_policies=null`` (every published version kept), then
the same command with ``--eval-at N`` evaluates each run that went past version N at vN (the runs
themselves are skipped: they are in the results file), and ``reflexdb compare ... --at-version N``
scores every run there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from arms import CLI, ROOT, RUN_SUMMARY, home_env

sys.path.insert(0, str(ROOT / "benchmarks"))
from memory_bench import run_polled  # noqa: E402

FIX_SHOT = ["--set", "tasks.level=9", "--set", "tasks.template=tool_python_fix_shot"]
#: Each arm is a list of overrides of the experiment's config, or ``(config, overrides)`` when the
#: arm is another example file (a baseline with its own file, say).
EXPERIMENTS = {
    "r3l-oracle": {
        "config": ROOT / "examples" / "arithmetic-r3l.yaml",
        "arms": {"grpo": ["--set", "algorithm=grpo"], "r3l-oracle": ["--set", "r3l.guidance=oracle"]},
    },
    "cleaner-fixshot": {
        "config": ROOT / "examples" / "arithmetic-cleaner.yaml",
        "arms": {"dapo": (ROOT / "examples" / "arithmetic-tool-dapo.yaml", FIX_SHOT), "cleaner": FIX_SHOT},
    },
}


def arm_command(exp: dict, arm: str) -> tuple[Path, list[str]]:
    """The config file and the overrides of ``arm``."""
    spec = exp["arms"][arm]
    return spec if isinstance(spec, tuple) else (exp["config"], spec)


def run_one(exp: dict, arm: str, seed: int, args) -> dict:
    name = f"{arm}-s{seed}"
    env = home_env(args.home)
    config, arm_set = arm_command(exp, arm)
    cmd = CLI + ["run", str(config), "--set", f"run={name}", "--set", f"seed={seed}",
                 "--max-steps", str(args.max_steps), "--max-seconds", str(args.max_seconds)] + arm_set
    for kv in args.overrides:
        cmd += ["--set", kv]
    log = args.home / f"{name}.log"
    t0 = time.time()
    rc, poller = run_polled(cmd, env, log)
    peaks: dict[str, int] = {}
    for role, peak in poller.peaks.values():
        peaks[role] = max(peaks.get(role, 0), round(peak / 2**20))
    text = log.read_text(errors="replace")
    m = RUN_SUMMARY.search(text)
    return {"run": name, "arm": arm, "seed": seed, "rc": rc, "wall_s": round(time.time() - t0, 1),
            "pass_at_1_before": float(m.group(4)) if m else None, "pass_at_1_after": float(m.group(6)) if m else None,
            "peak_rss_mib": peaks, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            **({"log_tail": text[-2000:]} if rc else {})}


def eval_at(exp: dict, r: dict, version: int, args) -> dict | None:
    """Held-out pass@1 of run ``r`` at policy version ``version`` (``reflexdb eval --checkpoint vN``,
    the run's own overrides), for ``reflexdb compare --at-version``: None when the run ended at or
    before that version (its last evaluation is already there)."""
    env = home_env(args.home)
    q = subprocess.run(CLI + ["sql", "--json", "SELECT max(p.version) AS v FROM policy_versions p JOIN runs r "
                              "ON r.id = p.run_id WHERE r.name = :'run'", "-v", f"run={r['run']}"],
                       env=env, capture_output=True, text=True, check=True)
    last = json.loads(q.stdout)[0]["v"] or 0
    if last <= version:
        return None
    config, arm_set = arm_command(exp, r["arm"])
    cmd = CLI + ["eval", "-c", str(config), "--set", f"run={r['run']}", "--set", f"seed={r['seed']}",
                 "--checkpoint", f"v{version}", "--json"] + arm_set
    for kv in args.overrides:
        cmd += ["--set", kv]
    t0 = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        return {"version": version, "rc": out.returncode, "stderr_tail": out.stderr[-2000:]}
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {"version": version, "rc": 0, "last_version": last, "seconds": round(time.time() - t0, 1),
            "pass_at_1": res.get("pass_at_1")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", choices=sorted(EXPERIMENTS), required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", help="a subset of the experiment's arms, comma-separated (default: all)")
    ap.add_argument("--max-steps", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=1500)
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="a config override for every arm (repeatable), e.g. --set learner.keep_policies=null to keep "
                         "every published version for `reflexdb eval --checkpoint vN` at equal steps")
    ap.add_argument("--eval-at", type=int, help="then evaluate every run that went past version N at vN "
                    "(needs --set learner.keep_policies=null during the runs), for `reflexdb compare --at-version N`")
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--json-out", type=Path, required=True)
    args = ap.parse_args()
    exp = EXPERIMENTS[args.experiment]
    arms = args.arms.split(",") if args.arms else list(exp["arms"])
    args.home.mkdir(parents=True, exist_ok=True)
    res = json.loads(args.json_out.read_text()) if args.json_out.exists() else {
        "experiment": args.experiment, "max_steps": args.max_steps, "max_seconds": args.max_seconds, "runs": []}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in arms:
            if any(r["arm"] == arm and r["seed"] == seed and r["rc"] == 0 for r in res["runs"]):
                continue
            print(f"== {arm} seed {seed}", flush=True)
            r = run_one(exp, arm, seed, args)
            print(json.dumps(r), flush=True)
            res["runs"] = [x for x in res["runs"] if not (x["arm"] == arm and x["seed"] == seed)] + [r]
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(res, indent=1))
    if args.eval_at is not None:
        for r in res["runs"]:
            key = f"at_v{args.eval_at}"
            done = key in r and (r[key] is None or r[key].get("rc") == 0)  # None: the run ended at or before vN
            if r["rc"] or done:
                continue
            print(f"== {r['run']} at v{args.eval_at}", flush=True)
            r[key] = eval_at(exp, r, args.eval_at, args)
            print(json.dumps(r[key]), flush=True)
            args.json_out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
