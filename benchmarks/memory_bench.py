"""Peak resident memory of each process of the examples' ``reflexdb run``.

For each example it runs what a user types, ``reflexdb run examples/NAME.yaml`` (with
``--max-steps`` and ``--no-eval`` unless ``--eval``), in a fresh ``REFLEXDB_HOME`` on the embedded
PostgreSQL, and polls the command's process tree every 0.2 s with psutil: each process's peak
resident set size (RSS), grouped by role (the ``reflexdb run`` launcher, collector, learner, eval,
PostgreSQL; the largest process of each role). A process that lives less than one poll can be
missed; a peak that lasts less than one poll can be under-read (by at most what it allocates in
0.2 s). ``REFLEXDB_MODEL_CACHE`` is shared between examples (the SmolLM2 conversion once)::

    python benchmarks/memory_bench.py --examples arithmetic-r3l,arithmetic-cleaner --steps 3 \\
        --json-out /tmp/memory.json
    python benchmarks/memory_bench.py --report /tmp/memory.json     # the markdown table

``--set KEY=VALUE`` goes to ``reflexdb run`` (e.g. ``--set learner.micro_batch_tokens=null``: the
learner's passes by row count alone, as before the token budget).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "reflexdb.cli.main"]
ROLES = ("launcher", "collector", "learner", "eval", "postgres", "other")


def role(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
    if "postgres" in name or "postgres" in cmd.split(" ")[0]:
        return "postgres"
    for r, words in (("collector", (" collect",)), ("learner", (" learn",)), ("eval", (" eval",)),
                     ("launcher", (" run ",))):
        if any(w in f" {cmd} " for w in words):
            return r
    return "other"


class Poller(threading.Thread):
    def __init__(self, root_pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.interval = root_pid, interval
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (role, peak rss bytes)
        self.commands: dict[int, str] = {}  # pid -> its command line (the first 120 characters)
        self.total_peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                root = psutil.Process(self.root)
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:
                try:
                    rss = p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                total += rss
                r, peak = self.peaks.get(p.pid, (None, 0))
                if r is None or r == "other":
                    r = role(p)
                    try:
                        self.commands[p.pid] = " ".join(p.cmdline())[:120]
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        pass
                self.peaks[p.pid] = (r, max(peak, rss))
            self.total_peak = max(self.total_peak, total)
            time.sleep(self.interval)


def run_polled(cmd: list[str], env: dict, log: Path) -> tuple[int, Poller]:
    """Run ``cmd`` (output to ``log``) while polling its process tree; its exit code and the poller."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        poller = Poller(proc.pid)
        poller.start()
        rc = proc.wait()
        poller.done.set()
        poller.join()
    return rc, poller


def run_example(name: str, args) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"reflexdb-memory-{name}-"))
    env = {k: v for k, v in os.environ.items() if k != "REFLEXDB_DATABASE_URL"}
    env.update(REFLEXDB_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("REFLEXDB_MODEL_CACHE", str(Path(tempfile.gettempdir()) / "reflexdb-memory-models"))
    cmd = CLI + ["run", str(ROOT / "examples" / f"{name}.yaml"), "--max-steps", str(args.steps)]
    if not args.eval:
        cmd.append("--no-eval")
    for kv in args.set:
        cmd += ["--set", kv]
    t0 = time.time()
    log = home / "run.log"
    rc, poller = run_polled(cmd, env, log)
    wall = time.time() - t0
    by_role = {r: 0 for r in ROLES}
    for r, peak in poller.peaks.values():
        by_role[r] = max(by_role[r], peak)
    others = sorted(((peak, poller.commands.get(pid, "?")) for pid, (r, peak) in poller.peaks.items() if r == "other"),
                    reverse=True)
    steps = None
    for line in log.read_text(errors="replace").splitlines():
        if "step " in line and "loss" in line:
            steps = line.strip()[:160]
    result = {
        "example": name, "rc": rc, "wall_s": round(wall, 1), "steps": args.steps, "eval": args.eval, "set": args.set,
        "peak_mib": {r: round(v / 2**20) for r, v in by_role.items() if v},
        "largest_mib": round(max(by_role.values()) / 2**20), "tree_total_peak_mib": round(poller.total_peak / 2**20),
        "last_step_line": steps,
        "largest_other": {"mib": round(others[0][0] / 2**20), "command": others[0][1]} if others else None,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if rc != 0:
        result["log_tail"] = log.read_text(errors="replace")[-3000:]
    if not args.keep:
        shutil.rmtree(home, ignore_errors=True)
    else:
        result["home"] = str(home)
    return result


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def report(path: Path) -> str:
    data = json.loads(path.read_text())
    out = [f"Machine: {data['machine']}; {data['date']}.", "",
           "| example | settings | steps | wall s | launcher | collector | learner | eval | PostgreSQL (largest) | largest process | rc |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["results"]:
        p = r["peak_mib"]
        cells = [f"{p[k] / 1024:.2f}" if k in p else "–" for k in ("launcher", "collector", "learner", "eval", "postgres")]
        out.append(f"| {r['example']} | {' '.join(r['set']) or 'as shipped'} | {r['steps']} | {r['wall_s']:.0f} | "
                   + " | ".join(cells) + f" | **{r['largest_mib'] / 1024:.2f}** | {r['rc']} |")
    out.append("")
    out.append("GiB, peak RSS of the largest process of each role (psutil, polled every 0.2 s).")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", default=",".join(sorted(p.stem for p in (ROOT / "examples").glob("*.yaml"))))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--eval", action="store_true", help="evaluate before and after, as the README's command does")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--keep", action="store_true", help="keep each REFLEXDB_HOME")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--report", type=Path)
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
        return
    data = {"machine": f"{cpu_model()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.1f} GiB",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "results": []}
    if args.json_out and args.json_out.exists():
        data["results"] = json.loads(args.json_out.read_text())["results"]
    for name in [n for n in args.examples.split(",") if n]:
        res = run_example(name, args)
        data["results"].append(res)
        print(json.dumps(res), flush=True)
        if args.json_out:
            args.json_out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
