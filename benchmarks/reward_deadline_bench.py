"""What the reward deadline costs (collector/deadline.py, issue 50; docs/benchmarks.md).

Three measurements on the built-in ``math`` reward and a typical answer, alternated in rounds:

- **direct**: ``get_reward("math")(response, truth)`` in this process (before issue 50);
- **deadline**: the same call through ``Deadline`` (a forked child, a pipe each way);
- each again with an answer math-verify has not seen (its parse is cached by answer);
- **fork**: the first call after a timeout, which forks a fresh child, in a process holding
  ``--hold-mb`` of touched memory (a collector holds its model's weights).

And the worst case it bounds: a 1 MB answer of repeated ``\\boxed{`` through the reward, before
(the quadratic extractor of ``--baseline-rev``, on 3,000 repeats: it does not finish 1 MB) and now.

    python benchmarks/reward_deadline_bench.py --rounds 5 --calls 200 --json-out benchmarks/results/reward_deadline.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reflexdb.collector.deadline import Deadline, RewardTimeout  # noqa: E402
from reflexdb.collector.rewards import get_reward  # noqa: E402

RESPONSE = "We add the numbers: 17 + 25 = 42. So the answer is \\boxed{42}."
TRUTH = "42"


_fresh = iter(range(10**9))


def _per_call(fn, calls: int, fresh: bool = False) -> list[float]:
    """Seconds per call; ``fresh``: a number math-verify has not parsed yet each time (its parse is
    cached by answer, and a model's answers mostly repeat within a group, not across groups)."""
    out = []
    for _ in range(calls):
        response = RESPONSE.replace("42", str(100 + next(_fresh))) if fresh else RESPONSE
        t0 = time.perf_counter()
        fn(response, TRUTH)
        out.append(time.perf_counter() - t0)
    return out


def _hang(text, truth):
    if text == "hang":
        time.sleep(3600)
    return get_reward("math")(text, truth)


def _old_extract_boxed(rev: str):
    """``extract_boxed`` of commit ``rev`` (before issue 50) with the patterns it reads, taken out
    of that commit's collector/rewards.py (the rest of the module would register rewards again)."""
    source = subprocess.run(["git", "show", f"{rev}:collector/rewards.py"], capture_output=True, text=True,
                            check=True, cwd=ROOT).stdout
    keep = [node for node in ast.parse(source).body
            if (isinstance(node, ast.FunctionDef) and node.name == "extract_boxed")
            or (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "").startswith("_BOXED"))]
    namespace: dict = {"re": re}
    exec(compile(ast.Module(body=keep, type_ignores=[]), f"{rev}:collector/rewards.py", "exec"), namespace)
    return namespace["extract_boxed"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--hold-mb", type=int, default=2048, help="memory this process holds when it forks")
    ap.add_argument("--baseline-rev", default="0add130", help="a commit before issue 50, for the worst case")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()

    direct = get_reward("math")
    direct(RESPONSE, TRUTH)  # math-verify imports and compiles its grammars on first use
    guarded = Deadline(direct, 10)
    guarded(RESPONSE, TRUTH)
    times: dict[str, list[float]] = {"direct": [], "deadline": [], "direct, new answers": [],
                                     "deadline, new answers": []}
    for _ in range(a.rounds):
        times["direct"] += _per_call(direct, a.calls)
        times["deadline"] += _per_call(guarded, a.calls)
        times["direct, new answers"] += _per_call(direct, a.calls, fresh=True)
        times["deadline, new answers"] += _per_call(guarded, a.calls, fresh=True)
    guarded.close()

    held = bytearray(a.hold_mb * 2**20)
    held[::4096] = b"x" * len(held[::4096])  # touched: the pages are the process's
    forks = []
    hang = Deadline(_hang, 0.2)
    for _ in range(a.rounds):
        try:
            hang("hang", TRUTH)
        except RewardTimeout:
            pass
        t0 = time.perf_counter()
        hang(RESPONSE, TRUTH)  # forks a fresh child, which imports nothing new (forked)
        forks.append(time.perf_counter() - t0)
    hang.close()
    del held

    worst = {}
    old = _old_extract_boxed(a.baseline_rev)
    for n in (1000, 3000):
        t0 = time.perf_counter()
        old("\\boxed{" * n)
        worst[f"before: extract_boxed, {n} x \\boxed{{ ({7 * n / 1000:g} KB)"] = time.perf_counter() - t0
    for n in (3000, 2**20 // 7):
        t0 = time.perf_counter()
        direct("\\boxed{" * n, TRUTH)
        worst[f"now: the math reward, {n} x \\boxed{{ ({7 * n / 1000:g} KB)"] = time.perf_counter() - t0

    def p(xs, q):
        return statistics.quantiles(xs, n=100)[q - 1] if len(xs) >= 100 else max(xs)

    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip(),
        "cpus": __import__("os").cpu_count(), "load_before": __import__("os").getloadavg()[0],
        "calls": {k: {"n": len(v), "p50_ms": statistics.median(v) * 1e3, "p99_ms": p(v, 99) * 1e3}
                  for k, v in times.items()},
        "deadline_over_direct_p50": statistics.median(times["deadline"]) / statistics.median(times["direct"]),
        "deadline_over_direct_p50_new_answers": (statistics.median(times["deadline, new answers"])
                                                 / statistics.median(times["direct, new answers"])),
        "fork_after_timeout": {"hold_mb": a.hold_mb, "n": len(forks), "p50_ms": statistics.median(forks) * 1e3,
                               "max_ms": max(forks) * 1e3},
        "worst_case_s": worst,
    }
    for k, v in result["calls"].items():
        print(f"{k:>21}: p50 {v['p50_ms']:.3f} ms, p99 {v['p99_ms']:.3f} ms ({v['n']} calls)")
    print(f"deadline / direct (p50): {result['deadline_over_direct_p50']:.2f}x, "
          f"new answers {result['deadline_over_direct_p50_new_answers']:.2f}x")
    print(f"first call after a timeout, holding {a.hold_mb} MB: p50 {result['fork_after_timeout']['p50_ms']:.1f} ms")
    for k, v in worst.items():
        print(f"{k}: {v:.2f} s")
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
