"""What the benchmarks of this folder record of the machine they ran on, and the CPU seconds of the
embedded PostgreSQL's processes (collect_bench.py, learner_bench.py, store_bench.py and, through
store_bench, scale_bench.py).

Linux's ``/proc``; a fact that cannot be read there is left out. Scripts import it as
``from machine import ...``: Python puts a script's own folder first on its path.
"""

from __future__ import annotations

import os
from pathlib import Path


def host_facts() -> dict:
    """``mem_gib`` (total memory) and ``cpu`` (the CPU's model name), those that could be read."""
    info: dict = {}
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    if (cpu := cpu_model()) is not None:
        info["cpu"] = cpu
    return info


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``), None where it does not say."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def process_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` (nanosecond resolution, from /proc/PID/schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def server_cpu(pgdata: Path | None) -> float | None:
    """CPU seconds used so far by the embedded server of data directory ``pgdata`` (its postmaster
    and the postmaster's children); None for an external server (``pgdata`` None) or one not running.

    Processes that exited since the last call are not counted, so call it around stretches of work
    that keep their connections.
    """
    if pgdata is None:
        return None
    try:
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if int(entry.name) == postmaster or ppid == postmaster:
                total += process_cpu(int(entry.name))
        except (OSError, ValueError):
            continue
    return total
