"""What the CLI's child processes share (``reflexdb run``'s collectors and learner, ``reflexdb ui``'s
MLflow server and explorer): how they are started, and how they die with their parent."""

from __future__ import annotations

import signal
import sys

#: ``python -c`` in place of ``-P -m`` before Python 3.11: drop the working directory that ``-c``
#: puts first on the path, then run the module as ``-m`` would (``sys.argv[0]`` its file).
_SAFE_MAIN = ("import runpy, sys\n"
              "if sys.path and sys.path[0] == '':\n"
              "    del sys.path[0]\n"
              "del sys.argv[0]\n"
              "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


def python_module(module: str, *, safe_path_flag: bool | None = None) -> list[str]:
    """The command line of ``python -m MODULE`` in this interpreter, with the working directory kept
    off the module path.

    ``python -m`` puts the working directory first on ``sys.path``: a folder named ``reflexdb`` (a
    clone of the project) where the user stands would shadow the installed package in every child
    (issue 60). Python 3.11's ``-P`` leaves it out; before 3.11, a ``-c`` bootstrap removes it and
    runs the module with :func:`runpy.run_module`, as ``-m`` does. ``PYTHONPATH`` counts in both.

    Args:
        module: the module to run (``reflexdb.cli.main``, ``mlflow``).
        safe_path_flag: use ``-P`` (default: on Python 3.11 and later); ``False`` gives the bootstrap.
    """
    if safe_path_flag is None:
        safe_path_flag = sys.version_info >= (3, 11)
    if safe_path_flag:
        return [sys.executable, "-P", "-m", module]
    return [sys.executable, "-c", _SAFE_MAIN, module]


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGTERM this child when its parent dies (Linux prctl PR_SET_PDEATHSIG):
    a parent killed outright (SIGKILL) cannot stop its children itself."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (torchrun's ranks), from Linux's ``/proc``; [] elsewhere."""
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(stat.parent.name))
    return found
