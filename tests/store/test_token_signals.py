"""Per-token learner signals (revision 0028, table ``token_signals``): a learner step writes what its
loss used at each token beside each consumption row, or nothing with ``learner.record_token_signals``
off; the rows go with their step (resume), their run (delete, archive) and come back with it
(restore); the explorer's trajectory page shows them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reflexdb import TaskIn
from reflexdb.records import TokenSignals
from reflexdb.store import signal_arrays
from tests.factories import make_group, setup_run
from tests.processes import rows
from tests.store.test_learn import _learner, tiny_group

NAN = float("nan")


def _signals(store, run: int, step: int) -> dict[int, TokenSignals]:
    """The step's token_signals rows by trajectory id, decoded."""
    found = rows(store, "SELECT g.trajectory_id, g.advantage, g.log_ratio, g.clipped, g.entropy FROM token_signals g "
                        "JOIN learner_steps s ON s.id = g.step_id WHERE s.run_id = :run AND s.step = :step",
                 run=run, step=step)
    return {tid: signal_arrays(values) for tid, *values in found}


# ------------------------------------------------------------------ the learner (tiny model, CPU)


@pytest.mark.model
def test_a_learner_step_writes_each_rows_signals(store, tmp_path, monkeypatch, model_cache):
    """Two groups of 4 in micro-batches of 4 (8 rows: two passes), one NULL reward and one row with
    two tokens out of the loss mask: a row per consumed trajectory, of its response length; the
    advantage is the row's (consumption.advantages' last stage) on its loss tokens and none
    elsewhere, none at all for the NULL reward (GRPO leaves the row out); π_old recomputed is this
    step's own forward, so the log-ratio is exactly 0 and nothing is clipped; the entropy is there
    for every token."""
    rng = np.random.default_rng(3)
    run = store.create_run("learn-test")
    t1, t2 = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(2)])
    ga = tiny_group(rng, run, t1, rewards=[1.0, 0.0, 0.5, None])
    ga.trajectories[0].loss_mask = np.array([1, 1, 0, 0] + [1] * (len(ga.trajectories[0].response_ids) - 4), bool)
    ga = store.write_group(ga)
    gb = store.write_group(tiny_group(rng, run, t2, rewards=[0.2, 0.2, 0.2, 0.6]))
    lr, _ = _learner(store, tmp_path, monkeypatch)
    lr.setup()
    lr.step([ga.group_id, gb.group_id])

    got = _signals(store, lr.run_id, 1)
    consumed = dict(rows(store, "SELECT c.trajectory_id, c.advantages[array_upper(c.advantages, 1)] FROM consumption c "
                                "JOIN learner_steps s ON s.id = c.step_id WHERE s.run_id = :r AND s.step = 1",
                         r=lr.run_id))
    assert set(got) == set(consumed) and len(got) == 8
    lengths = dict(rows(store, "SELECT id, response_length FROM trajectories WHERE run_id = :r", r=lr.run_id))
    null_reward = ga.trajectory_ids[3]
    for tid, sig in got.items():
        n = lengths[tid]
        assert len(sig.entropy) == len(sig.clipped) == n
        assert np.all(np.isfinite(sig.entropy)) and np.all(sig.entropy >= 0)
        assert not sig.clipped.any()
        if tid == null_reward:
            assert sig.advantage is None and sig.log_ratio is None  # not among GRPO's rows
            continue
        mask = np.ones(n, bool) if tid != ga.trajectory_ids[0] else np.array([1, 1, 0, 0] + [1] * (n - 4), bool)
        # float16 keeps the advantage to 3 significant digits
        assert sig.advantage[mask] == pytest.approx(np.full(mask.sum(), consumed[tid]), rel=1e-3, abs=1e-3)
        assert np.isnan(sig.advantage[~mask]).all() and np.isnan(sig.log_ratio[~mask]).all()
        assert np.all(sig.log_ratio[mask] == 0.0)  # π_old = this forward, detached: ρ = 1 exactly


@pytest.mark.model
def test_turned_off_a_learner_step_writes_none(store, tmp_path, monkeypatch, model_cache):
    rng = np.random.default_rng(4)
    run = store.create_run("learn-test")
    t1, t2 = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(2)])
    g = [store.write_group(tiny_group(rng, run, t)).group_id for t in (t1, t2)]
    lr, _ = _learner(store, tmp_path, monkeypatch, record_token_signals=False)
    lr.setup()
    lr.step(g)
    assert rows(store, "SELECT count(*) FROM consumption") == [(8,)]
    assert rows(store, "SELECT count(*) FROM token_signals") == [(0,)]


@pytest.mark.model
def test_behaviour_pi_old_records_the_ratio_the_loss_clipped(store, tmp_path, monkeypatch, model_cache):
    """``pi_old: behaviour``: the ratio is π_θ over the stored behaviour log-probs (far from 1 for a
    random model and random tokens), so the clip is active somewhere; recorded exactly where
    ``clip(ρ)·A < ρ·A``."""
    rng = np.random.default_rng(5)
    run = store.create_run("learn-test")
    t1, t2 = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(2)])
    g = [store.write_group(tiny_group(rng, run, t)).group_id for t in (t1, t2)]
    lr, _ = _learner(store, tmp_path, monkeypatch, pi_old="behaviour")
    lr.setup()
    lr.step(g)
    got = _signals(store, lr.run_id, 1)
    assert len(got) == 8
    flagged = 0
    for sig in got.values():
        ratio = np.exp(sig.log_ratio.astype(np.float64))
        a = sig.advantage.astype(np.float64)
        should = np.clip(ratio, 0.8, 1.2) * a < ratio * a
        near = np.abs(np.abs(ratio - 1) - 0.2) < 2e-2  # float16 rounding at the clip's edges
        assert np.all((sig.clipped == should) | near)
        flagged += int(sig.clipped.sum())
    assert flagged > 0


# ------------------------------------------------------------------ the store


def _a_step_with_signals(store, name="signals"):
    run, (task, *_) = setup_run(store, name)
    w = store.write_group(make_group(np.random.default_rng(0), run, task, size=3))
    a, b, c = w.trajectory_ids
    signals = {a: TokenSignals(np.array([0.75, NAN]), np.array([0.01, NAN]), np.array([True, False]),
                               np.array([1.5, 0.0])),
               b: TokenSignals(None, None, np.zeros(4, bool), np.array([0.5, 1.0, 2.0, 4.0]))}  # c: no row
    store.record_step(run, 1, 0, w.trajectory_ids, advantages={t: [0.75] for t in w.trajectory_ids},
                      advantage_stages=["group"], token_signals=signals)
    return run, w, signals


def test_record_step_writes_the_arrays_and_float2_array_reads_them(store):
    run, w, _ = _a_step_with_signals(store)
    a, b, c = w.trajectory_ids
    got = _signals(store, run, 1)
    assert set(got) == {a, b}
    assert got[a].advantage[0] == 0.75 and math.isnan(got[a].advantage[1]) and got[a].clipped.tolist() == [True, False]
    assert got[b].advantage is None and got[b].entropy.tolist() == [0.5, 1.0, 2.0, 4.0]
    # psql: float2_array gives the float16 values exactly (0.01 is 1311/1024 × 2^-7 = 0.01000213623046875 in float16)
    [(adv, ratio, clipped, entropy)] = rows(
        store, "SELECT float2_array(advantage), float2_array(log_ratio), bool_array(clipped), float2_array(entropy) "
               "FROM token_signals WHERE trajectory_id = :t", t=a)
    assert adv[0] == 0.75 and math.isnan(adv[1]) and np.float32(ratio[0]) == np.float32(0.01000213623046875)  # real: exact as float32
    assert clipped == [True, False] and entropy == [1.5, 0.0]
    [(raw,)] = rows(store, "SELECT float2_array('\\x00fc007c0100'::bytea)")  # -inf, inf, the smallest subnormal
    assert raw[:2] == [-math.inf, math.inf] and np.float32(raw[2]) == np.float32(2.0 ** -24)


def test_signals_that_do_not_fit_are_refused_and_nothing_is_recorded(store):
    run, (task, *_) = setup_run(store)
    w = store.write_group(make_group(np.random.default_rng(1), run, task, size=2))
    bad = {10**9: TokenSignals(None, None, np.zeros(2, bool), np.ones(2))}
    with pytest.raises(ValueError, match="which the step does not consume"):
        store.record_step(run, 1, 0, w.trajectory_ids, token_signals=bad)
    uneven = {w.trajectory_ids[0]: TokenSignals(np.ones(3), None, np.zeros(2, bool), np.ones(2))}
    with pytest.raises(ValueError, match="arrays of different lengths"):
        store.record_step(run, 1, 0, w.trajectory_ids, token_signals=uneven)
    assert rows(store, "SELECT count(*) FROM learner_steps") == [(0,)]


def test_signals_go_with_a_rolled_back_step_and_a_deleted_run(store):
    from reflexdb import runs

    run, w, _ = _a_step_with_signals(store)
    store.roll_back_steps(run, 0)  # resume from before step 1: its consumption and signals go
    assert rows(store, "SELECT count(*) FROM token_signals") == [(0,)]
    run2, _, _ = _a_step_with_signals(store, "other")
    store.record_step(run, 1, 0, w.trajectory_ids, token_signals={
        w.trajectory_ids[0]: TokenSignals(None, None, np.zeros(1, bool), np.ones(1))})
    runs.delete(store, run)
    assert rows(store, "SELECT DISTINCT run_id FROM token_signals") == [(run2,)]
    assert rows(store, "SELECT count(*) FROM pg_class WHERE relname = :p", p=f"token_signals_r{run}") == [(0,)]


def test_archive_and_restore_keep_the_signals_row_for_row(store, tmp_path, monkeypatch):
    from reflexdb.ops.archive import archive, restore

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    run, _, _ = _a_step_with_signals(store, "busy")
    query = ("SELECT trajectory_id, step_id, advantage, log_ratio, clipped, entropy FROM token_signals "
             "WHERE run_id = :r ORDER BY trajectory_id")
    before = rows(store, query, r=run)
    result = archive(store, "busy", tmp_path / "arc")
    assert result.rows["token_signals"] == 2
    assert rows(store, "SELECT count(*) FROM token_signals") == [(0,)]
    restore(store, tmp_path / "arc")
    assert rows(store, query, r=run) == before


# ------------------------------------------------------------------ the explorer


@pytest.mark.model
def test_the_trajectory_page_shows_what_the_learner_recorded(store, db_url, tmp_path, monkeypatch, model_cache):
    """From a learner step (tiny model) to the page: each token's tooltip carries the step's
    advantage, ratio, clip and entropy, and ``?color=entropy`` shades by the recorded entropy."""
    import html
    import re

    from reflexdb import roles
    from reflexdb.explorer.data import Explorer
    from tests.store.test_explorer import _get, _served

    roles.apply(store.engine)
    rng = np.random.default_rng(6)
    run = store.create_run("learn-test")
    t1, t2 = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(2)])
    g = [store.write_group(tiny_group(rng, run, t)) for t in (t1, t2)]
    lr, _ = _learner(store, tmp_path, monkeypatch)
    lr.setup()
    lr.step([w.group_id for w in g])
    tid = g[0].trajectory_ids[1]  # reward 1 in a group of 0, 1, 0, 1: advantage +0.866
    [(adv,)] = rows(store, "SELECT advantages[1] FROM consumption WHERE trajectory_id = :t", t=tid)
    db = Explorer(db_url)
    server, thread, base = _served(db)
    try:
        status, page, _ = _get(f"{base}/trajectories/{tid}?color=entropy")
    finally:
        server.should_exit = True
        thread.join(10)
        db.close()
    assert status == 200 and 'id="legend" data-color="entropy"' in page
    titles = [html.unescape(t) for t in re.findall(r'<span class="tok[^"]*" style="[^"]*" title="([^"]*)"', page)]
    assert titles and all(f"learner: advantage {adv:.3f}, ratio 1.000 (log 0.0000), not clipped, entropy " in t
                          for t in titles), titles[:2]
    assert all(bg.startswith("rgba(124, 58, 237") for bg in re.findall(r'class="tok[^"]*" style="background: ([^"]*)"', page))
