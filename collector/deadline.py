"""A reward function under a per-call deadline (issue 50): nothing a model writes can hang a collector.

A reward function reads what the model wrote. Built-in ones are linear in its size and bound the
text they hand to ``math-verify``, but a short answer can still be expensive (``9^{9^{9^9}}`` to a
computer-algebra system), a user's reward function can loop, and a thread cannot be stopped from
outside (a C extension does not even see ``signal.alarm``). So the call runs in a child process:

- the child is **forked** from the collector the first time it is needed, so it holds the reward
  function as the collector has it (built-in, a plug-in's, or one registered at run time: nothing is
  pickled but the text, the ground truth and the result) and stays for the next calls;
- each call waits at most ``timeout_s`` for the result. Past it the child is killed (whatever it was
  doing), :class:`RewardTimeout` is raised, and the next call forks a fresh child;
- an exception the function raises is raised again here, unchanged (``judge`` stores it as before);
  a child that dies (a crash in a C extension, the OOM killer) is a :class:`RewardProcessDied`;
- the child dies with the collector (``PR_SET_PDEATHSIG``): it holds copies of the collector's
  descriptors (database connections, stdout), which must close when a collector is killed.

The child runs the function in its main thread, so a library's own ``signal.alarm`` timeouts
(``math-verify``'s) work there too. A call costs a round trip through a pipe: tens of microseconds
against the milliseconds of scoring an answer (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from reflexdb.errors import ReflexdbError

_PR_SET_PDEATHSIG = 1


class RewardTimeout(ReflexdbError):
    """The reward function ran past its deadline: the call was stopped and scores 0."""


class RewardProcessDied(ReflexdbError):
    """The process running the reward function ended in the middle of a call."""


def _die_with(parent: int) -> None:
    """End this process when ``parent`` does (``PR_SET_PDEATHSIG``): a forked child holds copies of
    the collector's descriptors (its database connections, its stdout), which must close when a
    collector is killed, mid-call or not."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pipe's end-of-file still ends an idle child
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)


def _serve(fn: Callable, conn, theirs, parent: int) -> None:
    """The child: call ``fn`` on each request until the pipe closes (or the parent dies)."""
    theirs.close()  # the parent's end: held here too, it would keep the pipe open after the parent died
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the collector's to handle, not ours
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the collector's "finish the group" handler
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", fn(*args))
        except Exception as exc:  # noqa: BLE001 - sent back and raised in the caller
            reply = ("raised", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
            conn.send(("raised", TypeError(f"the reward function returned something that cannot be sent back: "
                                           f"{type(exc).__name__}: {exc}"[:1000])))


class Deadline:
    """``Deadline(fn, timeout_s)(*args)`` is ``fn(*args)``, run in a child process and stopped at
    ``timeout_s`` seconds (:class:`RewardTimeout`). Thread-safe: calls take turns."""

    def __init__(self, fn: Callable, timeout_s: float):
        if timeout_s <= 0:
            raise ValueError(f"a deadline must be > 0 seconds, got {timeout_s!r}")
        self.fn, self.timeout_s = fn, float(timeout_s)
        self.timeouts = 0  # calls stopped at the deadline
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None
        self._owner = os.getpid()

    def __call__(self, *args: Any) -> Any:
        with self._lock:
            conn = self._child()
            try:
                conn.send(args)
                if not conn.poll(self.timeout_s):
                    self.timeouts += 1
                    self._stop()
                    raise RewardTimeout(f"the reward function ran past its deadline of {self.timeout_s:g} s "
                                        f"(collector.reward_timeout_s) and was stopped; scored 0")
                status, value = conn.recv()
            except (EOFError, OSError, BrokenPipeError) as exc:
                if self._proc is not None:
                    self._proc.join(5)
                code = self._proc.exitcode if self._proc is not None else None
                self._stop()
                how = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
                raise RewardProcessDied(f"the reward function's process ended during the call ({how})") from exc
        if status == "raised":
            raise value
        return value

    def _child(self):
        """The pipe to a live child, forked now if there is none (or this is a forked copy of us)."""
        if self._proc is not None and (self._owner != os.getpid() or not self._proc.is_alive()):
            self._stop()
        if self._proc is None:
            ctx = multiprocessing.get_context("fork")
            parent, child = ctx.Pipe()
            self._proc = ctx.Process(target=_serve, args=(self.fn, child, parent, os.getpid()), daemon=True,
                                     name="reflexdb-reward")
            self._proc.start()
            child.close()
            self._conn, self._owner = parent, os.getpid()
        return self._conn

    def _stop(self) -> None:
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        if conn is not None:
            conn.close()
        if proc is not None and self._owner == os.getpid():
            if proc.is_alive():
                proc.kill()
            proc.join(5)

    def close(self) -> None:
        """Stop the child (it also ends with the collector: it is a daemon)."""
        with self._lock:
            self._stop()

    def __getstate__(self):  # a Deadline sent elsewhere starts its own child there
        return {"fn": self.fn, "timeout_s": self.timeout_s}

    def __setstate__(self, state):
        self.__init__(state["fn"], state["timeout_s"])
