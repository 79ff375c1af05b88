"""What the CLI's child processes share (``reflexdb run``'s collectors and learner, ``reflexdb ui``'s
MLflow server)."""

from __future__ import annotations

import signal


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGTERM this child when its parent dies (Linux prctl PR_SET_PDEATHSIG):
    a parent killed outright (SIGKILL) cannot stop its children itself."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass
