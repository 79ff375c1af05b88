"""How long the commands a newcomer types first take, as whole processes (docs/benchmarks.md).

- ``reflexdb check -q CONFIG``: validation with no database and no model (target: under a second);
- ``reflexdb --help``;
- ``reflexdb ui``: from the command to the printed URL, the server answering (target: seconds),
  then SIGTERM and the time until the command has stopped its server.

    python benchmarks/cli_latency.py --runs 5 [--json-out benchmarks/results/cli_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "reflexdb.cli.main"]


def _timed(cmd: list[str], env: dict) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=ROOT)
    return time.monotonic() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ui_once(env: dict) -> tuple[float, float]:
    port = _free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen(CLI + ["ui", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    ready = time.monotonic() - t0
    if not line.startswith("MLflow UI on"):
        proc.kill()
        raise SystemExit(f"reflexdb ui did not start: {line!r}")
    t1 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return ready, time.monotonic() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="reflexdb-cli-latency-"))
    env = dict(os.environ, REFLEXDB_HOME=str(home), HF_HUB_OFFLINE="1")
    cfg = str(ROOT / "examples" / "arithmetic-grpo.yaml")
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "machine": f"{os.cpu_count()} cores",
           "load_before": os.getloadavg()[0], "runs": args.runs, "seconds": {}}
    for name, cmd in (("check", CLI + ["check", "-q", cfg]), ("help", CLI + ["--help"])):
        _timed(cmd, env)  # warm the page cache
        out["seconds"][name] = [round(_timed(cmd, env), 3) for _ in range(args.runs)]
    first_ready, _ = _ui_once(env)  # the first start creates MLflow's sqlite store
    out["seconds"]["ui_first_start"] = [round(first_ready, 2)]
    ui = [_ui_once(env) for _ in range(args.runs)]
    out["seconds"]["ui_ready"] = [round(r, 2) for r, _ in ui]
    out["seconds"]["ui_stop"] = [round(s, 2) for _, s in ui]
    out["load_after"] = os.getloadavg()[0]
    for name, values in out["seconds"].items():
        print(f"{name:16} median {statistics.median(values):6.2f} s   min {min(values):6.2f}   max {max(values):6.2f}"
              f"   ({len(values)} runs)")
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
