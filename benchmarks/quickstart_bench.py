"""The README's run command, measured: ``reflexdb run examples/arithmetic-grpo.yaml``.

Each variant runs the command exactly as a newcomer would, in a fresh ``REFLEXDB_HOME`` (so the
SmolLM2 conversion, the embedded server's first start and both evaluations are included), and
records:

- wall clock of the whole command;
- training seconds: from the learner's publication of policy v0 to its last recorded step;
- held-out pass@1 before and after (parsed from the command's summary);
- peak resident memory of the largest process (GNU ``time -f %M``: the rusage of the command,
  which covers the launcher's children because it waits for them);
- the size of ``REFLEXDB_HOME`` afterwards.

Variants (``--variants``): ``auto`` leaves ``OMP_NUM_THREADS`` unset, so ``reflexdb run`` gives
each training process ``cores // processes`` threads; a number N sets ``OMP_NUM_THREADS=N`` for
every process (``2`` is torch's own default on a 2-core machine). They run one after the other,
in the order given::

    python benchmarks/quickstart_bench.py --variants auto,2 --json-out /tmp/quickstart.json
    python benchmarks/quickstart_bench.py --report /tmp/quickstart.json

Extra ``--set KEY=VALUE`` arguments go to ``reflexdb run`` (e.g. a shorter run while trying it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run_variant(name: str, args) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"reflexdb-quickstart-{name}-"))
    env = {k: v for k, v in os.environ.items() if k not in ("REFLEXDB_DATABASE_URL", "REFLEXDB_MODEL_CACHE")}
    env.update(REFLEXDB_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("OMP_NUM_THREADS", None)
    if name != "auto":
        env["OMP_NUM_THREADS"] = name
    rss_file = home / "maxrss.txt"
    cmd = ["/usr/bin/time", "-f", "%M", "-o", str(rss_file)] + CLI + ["run", str(args.config)]
    cmd += [f"--set={s}" for s in args.set or []]
    load_before = os.getloadavg()
    t0 = time.monotonic()
    with open(home / "stderr.log", "w") as err:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    peak_kib = int(rss_file.read_text().split()[-1])
    if proc.returncode != 0:
        raise SystemExit(f"variant {name}: exit {proc.returncode}; see {home / 'stderr.log'}")
    m = SUMMARY.search(proc.stdout)
    if not m:
        raise SystemExit(f"variant {name}: no summary in the output:\n{proc.stdout}")
    span = subprocess.run(CLI + ["sql", "SELECT round(extract(epoch FROM max(s.created_at) - min(p.created_at))) "
                                        "AS train_s, max(s.step) AS steps FROM learner_steps s JOIN policy_versions p "
                                        "ON p.run_id = s.run_id AND p.version = 0"],
                          env=env, capture_output=True, text=True, check=True).stdout
    train_s, steps = re.search(r"^\s*([\d.]+)\s*\|\s*(\d+)\s*$", span, re.M).groups()
    home_bytes = du(home)
    if not args.keep_home:
        shutil.rmtree(home, ignore_errors=True)  # 5 GiB of checkpoints per variant
    return {
        "variant": name, "wall_s": round(wall, 1), "train_s": float(train_s), "steps": int(steps),
        "eval_tasks": int(m.group(1)), "eval_samples": int(m.group(2)), "before_label": m.group(3),
        "before": float(m.group(4)), "after_label": m.group(5), "after": float(m.group(6)),
        "peak_rss_mib": round(peak_kib / 1024), "home_gib": round(home_bytes / 2**30, 2),
        "load_before": load_before, "load_after": os.getloadavg(),
    }


def report(res: dict) -> str:
    out = ["| variant | wall clock | training s | steps | s/step | held-out pass@1 before → after | peak RSS (MiB) | home (GiB) | 1-min load before / after |",
           "|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in res["variants"]:
        out.append(f"| {r['variant']} | {r['wall_s'] / 60:.1f} min | {r['train_s']:.0f} | {r['steps']} | {r['train_s'] / r['steps']:.1f} | "
                   f"{r['before']:.3f} → {r['after']:.3f} ({100 * (r['after'] - r['before']):+.1f} points) | "
                   f"{r['peak_rss_mib']} | {r['home_gib']} | "
                   f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "arithmetic-grpo.yaml")
    ap.add_argument("--variants", default="auto", help="comma-separated: auto and/or thread counts")
    ap.add_argument("--set", action="append", help="KEY=VALUE passed to reflexdb run (repeatable)")
    ap.add_argument("--keep-home", action="store_true", help="keep each variant's REFLEXDB_HOME (deleted by default)")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--report", type=Path, help="print the table of a results file and exit")
    args = ap.parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return
    res = {"machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE")
                                                                                        * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                       "platform": platform.platform()},
           "started": datetime.now(timezone.utc).isoformat(), "config": str(args.config), "set": args.set or [],
           "variants": []}
    for name in args.variants.split(","):
        res["variants"].append(run_variant(name.strip(), args))
        print(json.dumps(res["variants"][-1]), flush=True)
        if args.json_out:
            args.json_out.write_text(json.dumps(res, indent=1))
    res["finished"] = datetime.now(timezone.utc).isoformat()
    if args.json_out:
        args.json_out.write_text(json.dumps(res, indent=1))
    print(report(res))


if __name__ == "__main__":
    main()
