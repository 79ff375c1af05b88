"""PhaseTimer (reflexdb/timing.py) on a fake clock: exclusive time per phase, shares, laps, and a
synchronize only at phase boundaries."""

from __future__ import annotations

import pytest

from reflexdb.timing import PhaseTimer


class Clock:
    """A clock that moves only when told to."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_phases_sum_their_blocks_and_time_outside_them_is_in_no_phase():
    clock = Clock()
    timer = PhaseTimer(clock=clock)
    clock.advance(5.0)  # setup, before any phase: not in the wall time
    assert timer.elapsed() == 0.0 and timer.shares() == {}
    with timer("generate"):
        clock.advance(3.0)
    clock.advance(1.0)  # between phases: in the wall time, in no phase
    with timer("write"):
        clock.advance(2.0)
    with timer("generate"):
        clock.advance(2.0)
    assert timer.seconds == {"generate": 5.0, "write": 2.0}
    assert timer.elapsed() == 8.0
    assert timer.shares() == {"generate": 0.625, "write": 0.25}  # 5/8, 2/8; the other 1 s in no phase


def test_a_nested_phase_counts_once_in_itself_not_in_the_phase_around_it():
    clock = Clock()
    timer = PhaseTimer(clock=clock)
    with timer("forward_backward"):
        clock.advance(2.0)
        with timer("optimizer"):
            clock.advance(0.5)
        clock.advance(1.0)
    # forward_backward: 2 + 1 (the 0.5 s of the optimizer are the optimizer's); total 3.5 = the wall time
    assert timer.seconds == {"forward_backward": 3.0, "optimizer": 0.5}
    assert sum(timer.seconds.values()) == timer.elapsed() == 3.5


def test_a_phase_that_raises_keeps_its_time_and_closes():
    clock = Clock()
    timer = PhaseTimer(clock=clock)
    with pytest.raises(ZeroDivisionError):
        with timer("reward"):
            clock.advance(0.25)
            raise ZeroDivisionError
    clock.advance(1.0)  # after it: in no phase
    assert timer.seconds == {"reward": 0.25}


def test_sync_is_called_at_phase_boundaries_only_and_not_after_a_failure():
    clock = Clock()
    calls = []
    timer = PhaseTimer(clock=clock, sync=lambda: calls.append(clock.now))
    with timer("forward_backward"):
        for _ in range(8):  # micro-batches: no synchronize between them
            clock.advance(1.0)
        with timer("optimizer"):
            clock.advance(0.5)
    assert calls == [100.0, 108.0, 108.5, 108.5]  # enter, enter inner, leave inner, leave
    with pytest.raises(RuntimeError):
        with timer("read"):
            raise RuntimeError("CUDA error")
    assert len(calls) == 5  # the enter only: a failed device is not asked to synchronize


def test_lap_gives_each_step_its_own_part():
    clock = Clock()
    timer = PhaseTimer(clock=clock)
    with timer("read"):
        clock.advance(1.0)
    assert timer.lap() == {"read": 1.0}
    with timer("read"):
        clock.advance(0.5)
    with timer("publish"):
        clock.advance(2.0)
    assert timer.lap() == {"read": 0.5, "publish": 2.0}
    assert timer.lap() == {"read": 0.0, "publish": 0.0}
    assert timer.seconds == {"read": 1.5, "publish": 2.0}  # the totals stay whole


def test_timed_wraps_a_function_and_summary_is_a_short_line():
    clock = Clock()
    timer = PhaseTimer(clock=clock)

    def reward(text, truth):
        clock.advance(1.0)
        return text == truth

    judged = timer.timed("reward", reward)
    assert judged("4", "4") is True and judged("5", truth="4") is False
    with timer("generate"):
        clock.advance(7.0)
    clock.advance(1.0)  # 10 s in all: generate 70 %, reward 20 %, 10 % in no phase
    labels = {"generate": "gen", "score": "score", "reward": "rew", "write": "write"}
    assert timer.summary(labels) == "gen 70% rew 20%"  # in the labels' order; phases without time left out
    assert PhaseTimer(clock=clock).summary(labels) == ""
