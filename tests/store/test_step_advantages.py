"""Each consumed row's advantage after every advantage stage, recorded with its learner step
(revision 0023: ``learner_steps.advantage_stages``, ``consumption.advantages``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reflexdb import ReflexdbError, TaskIn
from tests.factories import make_group, setup_run
from tests.processes import rows
from tests.store.test_learn import _learner, tiny_group

STAGES = ["group", "clamp_negative"]


def _recorded(store, run: int, step: int) -> tuple[list | None, dict[int, list | None]]:
    """The step's stage names, and its consumed rows' advantages by trajectory id."""
    [(stages,)] = rows(store, "SELECT advantage_stages FROM learner_steps WHERE run_id = :run AND step = :step",
                       run=run, step=step)
    adv = rows(store, "SELECT c.trajectory_id, c.advantages FROM consumption c JOIN learner_steps s ON s.id = c.step_id "
                      "WHERE s.run_id = :run AND s.step = :step", run=run, step=step)
    return stages, dict(adv)


# ------------------------------------------------------------------ the store


def test_record_step_stores_each_rows_advantages_by_stage(store):
    run, (task, *_) = setup_run(store)
    w = store.write_group(make_group(np.random.default_rng(0), run, task, size=4))
    a, b, c, d = w.trajectory_ids
    advantages = {a: [0.75, 0.75], b: [-0.5, -0.1], c: [float("nan"), 0.0]}  # d left out: no advantage
    step_id = store.record_step(run, 1, 0, w.trajectory_ids, advantages=advantages, advantage_stages=STAGES)
    stages, got = _recorded(store, run, 1)
    assert stages == STAGES
    # real[]: -0.1 as float4; a value that is not finite is a NULL element; d's row is NULL
    assert got[a] == [0.75, 0.75] and got[b] == pytest.approx([-0.5, -0.1], abs=1e-7)
    assert got[c] == [None, 0.0] and got[d] is None
    assert rows(store, "SELECT count(*) FROM consumption WHERE step_id = :s", s=step_id) == [(4,)]
    # a retry of the same step and trajectories (its commit unacknowledged) is the recorded row
    assert store.record_step(run, 1, 0, w.trajectory_ids, advantages=advantages, advantage_stages=STAGES) == step_id
    assert store.record_step(run, 1, 0, list(reversed(w.trajectory_ids))) == step_id
    assert _recorded(store, run, 1)[1] == got
    assert [t.times_sampled for t in store.read_trajectories(w.trajectory_ids, payloads=False)] == [1, 1, 1, 1]
    with pytest.raises(ReflexdbError, match="already recorded step 1"):
        store.record_step(run, 1, 0, [a, b], advantages={a: [1.0, 1.0]}, advantage_stages=STAGES)


def test_a_step_without_advantages_records_none(store):
    run, (task, *_) = setup_run(store)
    w = store.write_group(make_group(np.random.default_rng(1), run, task, size=2))
    store.record_step(run, 1, 0, w.trajectory_ids)
    assert _recorded(store, run, 1) == (None, {t: None for t in w.trajectory_ids})
    store.record_step(run, 2, 0, w.trajectory_ids, advantage_stages=["group"])  # stages, but no row has values
    assert _recorded(store, run, 2) == (["group"], {t: None for t in w.trajectory_ids})


@pytest.mark.parametrize("advantages,stages,message", [
    ({0: [1.0]}, None, "need advantage_stages"),
    ({0: [1.0]}, STAGES, "has 1 advantages for 2 stages"),
    ({10**9: [1.0, 1.0]}, STAGES, "which the step does not consume"),
])
def test_advantages_that_do_not_fit_are_refused_and_nothing_is_recorded(store, advantages, stages, message):
    run, (task, *_) = setup_run(store)
    w = store.write_group(make_group(np.random.default_rng(2), run, task, size=2))
    advantages = {w.trajectory_ids[0] if k == 0 else k: v for k, v in advantages.items()}
    with pytest.raises(ValueError, match=message):
        store.record_step(run, 1, 0, w.trajectory_ids, advantages=advantages, advantage_stages=stages)
    assert rows(store, "SELECT count(*) FROM learner_steps") == [(0,)]


# ------------------------------------------------------------------ the learner (tiny model, CPU)


def test_a_learner_step_records_the_advantages_of_every_stage(store, tmp_path, monkeypatch, model_cache):
    """Step 1 (no transform): the group advantages of non-binary rewards, a NULL reward's exactly 0,
    and no advantage (NULL) for a method's auxiliary row passed as ``extra``. Step 2 with a
    transform (clamp_negative at -0.25; R3L's positive amplification, turned on by its config, is
    checked in test_r3l.py): two stages, the second the clamp of the first."""
    from reflexdb.trainer.advantages import make_transform

    rng = np.random.default_rng(0)
    run = store.create_run("learn-test")
    t1, t2, t3, t4, t5 = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(5)])
    ga = store.write_group(tiny_group(rng, run, t1, rewards=[1.0, 0.0, 0.5, None]))
    gb = store.write_group(tiny_group(rng, run, t2, rewards=[0.2, 0.2, 0.2, 0.6]))
    aux = store.write_group(tiny_group(rng, run, t3, G=1, rewards=[1.0])).trajectory_ids[0]
    gc = store.write_group(tiny_group(rng, run, t4, rewards=[0.0, 1.0, 0.0, 0.0]))
    gd = store.write_group(tiny_group(rng, run, t5, rewards=[0.7, 0.7, 0.7, 0.7]))
    lr, _ = _learner(store, tmp_path, monkeypatch)  # micro-batches of 4: rows reordered by length
    lr.setup()

    lr.step([ga.group_id, gb.group_id], extra=[aux])
    stages, got = _recorded(store, lr.run_id, 1)
    assert stages == ["group"]
    # A_i = (r_i - mean) / (std + 1e-6), std the sample std (divisor G - 1) over the valid rows:
    # ga [1, 0, 0.5, NULL]: mean 0.5, centred 0.5, -0.5, 0, std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    #   -> ±0.5 / 0.500001 = ±0.999998, 0; the NULL reward's row exactly 0
    # gb [0.2, 0.2, 0.2, 0.6]: mean 0.3, centred -0.1 (×3), 0.3, std sqrt((3 · 0.01 + 0.09) / 3) = 0.2
    #   -> -0.1 / 0.200001 = -0.4999975 (×3), 0.3 / 0.200001 = 1.4999925
    one = 0.5 / (0.5 + 1e-6)
    expected = {**dict(zip(ga.trajectory_ids, [one, -one, 0.0, 0.0])),
                **dict(zip(gb.trajectory_ids, [-0.1 / 0.200001] * 3 + [0.3 / 0.200001]))}
    assert set(got) == {*expected, aux}
    for tid, a in expected.items():
        assert got[tid] == [pytest.approx(a, abs=1e-5)], tid
    assert got[ga.trajectory_ids[2]] == [0.0] and got[ga.trajectory_ids[3]] == [0.0]  # exactly
    assert got[aux] is None  # an auxiliary row has no advantage

    lr.transforms = [make_transform("clamp_negative", min_advantage=-0.25)]
    lr.step([gc.group_id, gd.group_id])
    stages, got = _recorded(store, lr.run_id, 2)
    assert stages == ["group", "clamp_negative"]
    # gc [0, 1, 0, 0]: mean 0.25, centred -0.25 (×3), 0.75, std sqrt((3 · 0.0625 + 0.5625) / 3) = 0.5
    #   -> -0.25 / 0.500001 = -0.499999 (×3), 0.75 / 0.500001 = 1.499997; clamped: -0.25, 1.499997
    # gd [0.7 ×4]: equal rewards -> exactly 0 (float32 would give 0.056 without the rule), clamped 0
    low, high = -0.25 / 0.500001, 0.75 / 0.500001
    for tid, r in zip(gc.trajectory_ids, [0.0, 1.0, 0.0, 0.0]):
        group, clamped = got[tid]
        assert group == pytest.approx(high if r else low, abs=1e-5)
        assert clamped == max(group, -0.25)  # the transform by hand, on the recorded first column
    assert all(got[tid] == [0.0, 0.0] for tid in gd.trajectory_ids)
    assert all(math.isfinite(v) for vs in got.values() for v in vs)
