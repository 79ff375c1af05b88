"""The tool sandbox's own time per call (collector/sandbox.py, docs/benchmarks.md).

Three measurements, alternated in rounds so drift from other jobs on the machine spreads evenly:

- **bare**: ``/usr/bin/python3 -I -c CODE`` as a plain subprocess (no isolation): what any
  interpreter start costs;
- **sandbox**: ``PythonSandbox().run(CODE)``: nsjail, namespaces, mounts, limits, the same code;
- **concurrent**: ``run_many`` of ``--batch`` calls at each ``--concurrency`` bound: calls per
  second, as a collector's tool calls from many episodes run.

CODE is a typical tool call: a small arithmetic program that prints its result. Also the time a
hostile call costs the caller (a loop to the timeout, a fork bomb, 100 MB of output, 512 MB of
shared memory, 300 MB of memfd, 200 KB of code), once each.

``--baseline-rev REV`` times the sandbox of another commit too (its ``collector/sandbox.py``,
loaded from git beside this one), in the same rounds: today's against the sandbox before a change,
in one run on one machine.

    python benchmarks/sandbox_bench.py --rounds 5 --calls 20 --baseline-rev 17b3405 \
        --json-out benchmarks/results/sandbox.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from reflexdb.collector.sandbox import PythonSandbox, SandboxLimits

CODE = "a = 48291 * 7713\nb = sum(range(1, 1001))\nprint(a + b)\n"
HOSTILE = {
    "infinite loop": "while True:\n    pass\n",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "print 100 MB": "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1024 * 1024)\n",
    "allocate 10 GB": "x = bytearray(10 * 1024 ** 3)\n",
    "shared memory 512 MB": ("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.shmat.restype = ctypes.c_void_p\n"
                             "libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n"
                             "for i in range(4):\n    sid = libc.shmget(0, 128 << 20, 0o1600)\n"
                             "    addr = libc.shmat(sid, None, 0)\n    ctypes.memset(addr, 1, 128 << 20)\n"
                             "    libc.shmdt(ctypes.c_void_p(addr))\n"),
    "memfd 300 MB": ("import os\nfds = []\nfor i in range(40):\n    fd = os.memfd_create('x')\n"
                     "    for j in range(7):\n        os.write(fd, b'x' * (1 << 20))\n"
                     "    fds.append(fd)\n"),
    "code of 200 KB": "x = 1\n" * 34_000 + "print(x)\n",
}


def baseline_sandbox(rev: str):
    """``collector/sandbox.py`` of commit ``rev`` with the files beside it that it reads (its
    cgroups module, seccomp policy and probe, where that commit has them), loaded as a package of
    its own: the sandbox of that commit, policy included."""
    package = Path(tempfile.mkdtemp()) / f"sandbox_{rev}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("sandbox.py", "cgroups.py", "sandbox.kafel", "sandbox_probe.py"):
        shown = subprocess.run(["git", "show", f"{rev}:collector/{name}"], capture_output=True, text=True)
        if shown.returncode == 0:
            (package / name).write_text(shown.stdout)
    sys.path.insert(0, str(package.parent))
    try:
        return importlib.import_module(f"{package.name}.sandbox")
    finally:
        sys.path.remove(str(package.parent))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="calls per round and kind")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--baseline-rev", help="also time the sandbox of this commit, in the same rounds")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    box = PythonSandbox(SandboxLimits())
    box.check()
    python = box.argv()[-3]  # the interpreter the sandbox runs
    old = None
    if args.baseline_rev:
        module = baseline_sandbox(args.baseline_rev)
        old = module.PythonSandbox(module.SandboxLimits())
        old.check()
    load_before = os.getloadavg()[0]
    bare, boxed, before = [], [], []
    for _ in range(args.rounds):
        for _ in range(args.calls):
            t0 = time.perf_counter()
            subprocess.run([python, "-I", "-c", CODE], capture_output=True, check=True, env={})
            bare.append(time.perf_counter() - t0)
        for _ in range(args.calls):
            res = box.run(CODE)
            assert res.status == "ok", res
            boxed.append(res.seconds)
        for _ in range(args.calls if old is not None else 0):
            res = old.run(CODE)
            assert res.status == "ok", res
            before.append(res.seconds)
    concurrent = {}
    for bound in (int(c) for c in args.concurrency.split(",")):
        runner = PythonSandbox(SandboxLimits(), max_concurrency=bound)
        t0 = time.perf_counter()
        results = runner.run_many([CODE] * args.batch)
        wall = time.perf_counter() - t0
        assert all(r.status == "ok" for r in results)
        concurrent[bound] = {"calls_per_s": round(args.batch / wall, 2), "wall_s": round(wall, 3),
                             "p50_call_s": round(statistics.median(r.seconds for r in results), 4)}
    hostile = {}
    for name, code in HOSTILE.items():
        res = box.run(code)
        hostile[name] = {"status": res.status, "seconds": round(res.seconds, 3), "detail": res.detail,
                         "exit_code": res.exit_code, "memory_peak_mb": res.memory_peak_mb}
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "cores": os.cpu_count(),
        "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
        "bare": {"p50_s": round(statistics.median(bare), 4), "p99_s": round(_pct(bare, 0.99), 4), "n": len(bare)},
        "sandbox": {"p50_s": round(statistics.median(boxed), 4), "p99_s": round(_pct(boxed, 0.99), 4), "n": len(boxed)},
        "ratio_p50": round(statistics.median(boxed) / statistics.median(bare), 2),
        **({"baseline": {"rev": args.baseline_rev, "p50_s": round(statistics.median(before), 4),
                         "p99_s": round(_pct(before, 0.99), 4), "n": len(before),
                         "ratio_p50_today_over_baseline": round(statistics.median(boxed) / statistics.median(before), 2)}}
           if before else {}),
        "concurrent": concurrent, "hostile": hostile,
    }
    print(json.dumps(out, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
