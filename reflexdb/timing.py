"""Where a process's time goes: seconds per named phase of its loop (issue 51).

::

    timer = PhaseTimer(sync=torch.cuda.synchronize)   # sync: on a GPU only
    with timer("read"):
        batch = ...
    with timer("forward_backward"):
        ...
        with timer("optimizer"):                       # nested: its time is its own
            ...
    timer.seconds      # {"read": 0.12, "forward_backward": 1.9, "optimizer": 0.3}
    timer.summary({"read": "read", "forward_backward": "fwd+bwd"})   # 'read 5% fwd+bwd 80%'

The collector and the learner each keep one and report it as metrics and in their progress lines
(docs/metrics.md, "Where the time goes").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any


class PhaseTimer:
    """Wall-clock seconds spent in named phases, summed since the first phase began.

    Phases nest, and a phase's time is its own (exclusive): while an inner phase runs, the phase
    around it stops counting. So no second is counted twice, the phases never add up to more than
    the wall time (:meth:`elapsed`), and what is left over is time in no phase (waiting on nothing
    named, bookkeeping). The wall time starts with the first phase, so the setup before the loop
    (loading a model, opening MLflow) does not dilute the shares.

    Args:
        clock: seconds, monotonic (``time.perf_counter``; a test passes a fake one).
        sync: called at every phase boundary before the clock is read, and only there. On a GPU
            this is ``torch.cuda.synchronize``: work queued in one phase is charged to that phase,
            not to the next one that happens to wait for it. A loop inside one phase (micro-batches)
            is never synchronised. ``None`` (a CPU): nothing is queued, nothing to wait for.

    One thread: the collector and the learner time their own loop's thread only.
    """

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], Any] | None = None):
        self.clock, self.sync = clock, sync
        self.started: float | None = None  # when the first phase began
        self.seconds: dict[str, float] = {}
        self._open: list[str] = []  # the phases entered and not yet left, innermost last
        self._mark = 0.0  # when the innermost open phase last started counting
        self._lapped: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Count the block's time as ``phase`` (less the time of phases nested in it)."""
        self._boundary()
        self._open.append(phase)
        try:
            yield
        except BaseException:
            self._boundary(sync=False)  # a device that failed may not answer a synchronize
            raise
        else:
            self._boundary()
        finally:
            self._open.pop()

    def _boundary(self, *, sync: bool = True) -> None:
        """Charge the time since the last boundary to the innermost open phase (if any)."""
        if sync and self.sync is not None:
            self.sync()
        now = self.clock()
        if self.started is None:
            self.started = now
        if self._open:
            phase = self._open[-1]
            self.seconds[phase] = self.seconds.get(phase, 0.0) + (now - self._mark)
        self._mark = now

    def timed(self, phase: str, fn: Callable) -> Callable:
        """``fn`` with each call counted as ``phase`` (a function handed to code that knows no timer)."""
        def call(*args, **kwargs):
            with self(phase):
                return fn(*args, **kwargs)

        return call

    def elapsed(self) -> float:
        """Wall-clock seconds since the first phase began (0 before)."""
        return 0.0 if self.started is None else self.clock() - self.started

    def lap(self) -> dict[str, float]:
        """Seconds per phase since the previous lap (or the start): one step's part of :attr:`seconds`."""
        out = {k: v - self._lapped.get(k, 0.0) for k, v in self.seconds.items()}
        self._lapped = dict(self.seconds)
        return out

    def shares(self) -> dict[str, float]:
        """Each phase's fraction of the wall time (:meth:`elapsed`); they sum to at most 1."""
        wall = self.elapsed()
        return {k: (v / wall if wall > 0 else 0.0) for k, v in self.seconds.items()}

    def summary(self, labels: dict[str, str]) -> str:
        """The shares as a progress line's part, ``'gen 71% rew 9% write 15%'``: the phases of
        ``labels`` (phase -> label) in its order, those with no time yet left out."""
        shares = self.shares()
        return " ".join(f"{label} {100 * shares[phase]:.0f}%" for phase, label in labels.items() if phase in shares)
