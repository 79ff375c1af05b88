"""Hooks for failure drills (``benchmarks/chaos.py``); they do nothing unless ``REFLEXDB_DRILL_DIR`` is set.

A drill kills processes at chosen moments (mid-generation, mid-write, mid-step, mid-publish) and
then checks that nothing committed was lost. For that each process says, while it runs:

- which **phase** it is in: :func:`phase` writes the name into ``<dir>/<pid>.phase`` (one
  ``pwrite`` of 16 bytes), so the drill can stop the process, read the phase, and kill it there;
- which groups it has **committed**: :func:`journal` appends a line to ``<dir>/<pid>.journal``
  after each commit returns, so the drill can check that every group a collector saw committed
  is in the database.

With ``REFLEXDB_DRILL_HOLD=<phase>`` too, a process stops itself (SIGSTOP) as it enters that
phase, so a drill can kill it exactly there, whatever the machine's speed.

With the variable unset (always, outside drills) each call is one attribute test.
"""

from __future__ import annotations

import os
import signal

PHASE_BYTES = 16
_DIR = os.environ.get("REFLEXDB_DRILL_DIR") or None
_HOLD = os.environ.get("REFLEXDB_DRILL_HOLD") or None
_phase_fd: int | None = None
_journal = None


def enabled() -> bool:
    return _DIR is not None


def phase(name: str) -> None:
    """Announce the phase this process enters (``generate``, ``write``, ``step``, ``publish``, ...)."""
    global _phase_fd
    if _DIR is None:
        return
    if _phase_fd is None:
        _phase_fd = os.open(os.path.join(_DIR, f"{os.getpid()}.phase"), os.O_CREAT | os.O_WRONLY, 0o600)
    os.pwrite(_phase_fd, name.encode()[:PHASE_BYTES].ljust(PHASE_BYTES), 0)
    if name == _HOLD:
        os.kill(os.getpid(), signal.SIGSTOP)  # the drill kills it here (or SIGCONT lets it go on)


def journal(line: str) -> None:
    """Record something this process knows is committed (one line, flushed at once)."""
    global _journal
    if _DIR is None:
        return
    if _journal is None:
        _journal = open(os.path.join(_DIR, f"{os.getpid()}.journal"), "a", buffering=1)
    _journal.write(line.rstrip("\n") + "\n")


def read_phase(directory: str, pid: int) -> str | None:
    """The phase process ``pid`` last announced (for the drill)."""
    try:
        with open(os.path.join(directory, f"{pid}.phase"), "rb") as f:
            return f.read(PHASE_BYTES).decode(errors="replace").strip() or None
    except FileNotFoundError:
        return None
