"""The tool sandbox's own time per call (collector/sandbox.py, docs/benchmarks.md).

Three measurements, alternated in rounds so drift from other jobs on the machine spreads evenly:

- **bare**: ``/usr/bin/python3 -I -c CODE`` as a plain subprocess (no isolation): what any
  interpreter start costs;
- **sandbox**: ``PythonSandbox().run(CODE)``: nsjail, namespaces, mounts, limits, the same code;
- **concurrent**: ``run_many`` of ``--batch`` calls at each ``--concurrency`` bound: calls per
  second, as a collector's tool calls from many episodes run.

CODE is a typical tool call: a small arithmetic program that prints its result. Also the time a
hostile call costs the caller (a loop to the timeout, a fork bomb, 100 MB of output), once each.

    python benchmarks/sandbox_bench.py --rounds 5 --calls 20 --json-out benchmarks/results/sandbox.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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
}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="calls per round and kind")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    box = PythonSandbox(SandboxLimits())
    box.check()
    python = box.argv("")[-4]  # the interpreter the sandbox runs
    load_before = os.getloadavg()[0]
    bare, boxed = [], []
    for _ in range(args.rounds):
        for _ in range(args.calls):
            t0 = time.perf_counter()
            subprocess.run([python, "-I", "-c", CODE], capture_output=True, check=True, env={})
            bare.append(time.perf_counter() - t0)
        for _ in range(args.calls):
            res = box.run(CODE)
            assert res.status == "ok", res
            boxed.append(res.seconds)
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
        hostile[name] = {"status": res.status, "seconds": round(res.seconds, 3), "detail": res.detail}
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "cores": os.cpu_count(),
        "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
        "bare": {"p50_s": round(statistics.median(bare), 4), "p99_s": round(_pct(bare, 0.99), 4), "n": len(bare)},
        "sandbox": {"p50_s": round(statistics.median(boxed), 4), "p99_s": round(_pct(boxed, 0.99), 4), "n": len(boxed)},
        "ratio_p50": round(statistics.median(boxed) / statistics.median(bare), 2),
        "concurrent": concurrent, "hostile": hostile,
    }
    print(json.dumps(out, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
