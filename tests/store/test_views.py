"""The SQL views on hand-made data with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from reflexdb import GroupIn
from tests.factories import make_trajectory, setup_run


def _rows(store, sql, **params):
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]


@pytest.fixture
def populated(store):
    """Three groups with known outcomes, a reflection, and two learner steps.

    g_none: 3 wrong (one truncated, one whose reward function failed), version 0
    g_some: 1 right + 1 wrong, version 1
    g_all:  2 right, version 2
    """
    run, (t1, t2, t3) = setup_run(store, "views")
    rng = np.random.default_rng(0)

    def traj(correct, **kw):
        kw.setdefault("reward", float(correct) if correct is not None else None)
        return make_trajectory(rng, correct=correct, text="answer " + str(correct), **kw)

    g_none = store.write_group(GroupIn(run_id=run, task_id=t1, policy_version=0, trajectories=[
        traj(False, logprobs=np.full(50, np.log(0.5), np.float32)),
        traj(False, finish_reason="length"),
        traj(None, error="ValueError: cannot parse"),
    ]))
    g_some = store.write_group(GroupIn(run_id=run, task_id=t2, policy_version=1, trajectories=[
        traj(True), traj(False, origin="hinted")]))
    g_all = store.write_group(GroupIn(run_id=run, task_id=t3, policy_version=2, trajectories=[traj(True), traj(True)]))
    with store.engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO reflections (trajectory_id, raw_text, parsed, pivot, outcome, root_cause, valid, run_id) VALUES "
            "(:t, 'old', '{}', 0, 'failure', 'older cause', true, :r), "
            "(:t, 'new', '{}', 0, 'failure', 'added instead of multiplied', true, :r), "
            "(:t, 'bad', NULL, NULL, NULL, 'invalid cause', false, :r)"), {"t": g_none.trajectory_ids[0], "r": run})
    store.record_step(run, 1, 2, list(g_none.trajectory_ids[:2]) + list(g_some.trajectory_ids))
    store.record_step(run, 2, 3, g_all.trajectory_ids[:1])
    return run, g_none, g_some, g_all


def test_failures(store, populated):
    run, g_none, g_some, g_all = populated
    rows = _rows(store, "SELECT * FROM failures ORDER BY trajectory_id")
    assert [r["trajectory_id"] for r in rows] == [*g_none.trajectory_ids, g_some.trajectory_ids[1]]
    first = rows[0]
    assert first["run"] == "views" and first["prompt"] == "What is 0+3?" and first["ground_truth"] == "3"
    assert first["response"] == "answer False" and first["extracted_answer"] == "7"
    assert first["confidence"] == pytest.approx(0.5, rel=1e-6)
    assert first["root_cause"] == "added instead of multiplied"  # latest valid reflection
    assert rows[1]["truncated"] is True and rows[1]["root_cause"] is None
    assert rows[2]["reward"] is None and rows[2]["error"] == "ValueError: cannot parse"
    assert rows[3]["origin"] == "hinted" and rows[3]["policy_version"] == 1


def test_failures_skip_replayed_copies(store, populated):
    run, g_none, *_ = populated
    rng = np.random.default_rng(5)
    task = _rows(store, "SELECT task_id FROM groups WHERE id = :g", g=g_none.group_id)[0]["task_id"]
    copy = make_trajectory(rng, correct=False, reward=0.0, origin="replayed",
                           parent_trajectory_id=g_none.trajectory_ids[0])
    w = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=3, kind="replay", trajectories=[copy]))
    ids = {r["trajectory_id"] for r in _rows(store, "SELECT trajectory_id FROM failures")}
    assert w.trajectory_ids[0] not in ids


def test_group_stats(store, populated):
    run, g_none, g_some, g_all = populated
    rows = {r["group_id"]: r for r in _rows(store, "SELECT * FROM group_stats")}
    n, s, a = rows[g_none.group_id], rows[g_some.group_id], rows[g_all.group_id]
    assert (n["class"], n["n_correct"], n["n_trajectories"], n["pass_rate"]) == ("none-pass", 0, 3, 0.0)
    assert (n["n_truncated"], n["n_reward_missing"]) == (1, 1)
    assert n["reward_mean"] == 0.0  # mean over the two rewards that exist
    assert (s["class"], s["pass_rate"], s["reward_mean"], s["reward_std"]) == ("some-pass", 0.5, 0.5, 0.5)
    assert (a["class"], a["pass_rate"], a["policy_version"], a["size"]) == ("all-pass", 1.0, 2, 2)


def test_staleness(store, populated):
    run, g_none, g_some, g_all = populated
    rows = _rows(store, "SELECT group_id, step, learner_version, producing_version, staleness, n_consumed "
                        "FROM staleness ORDER BY step, group_id")
    assert [(r["group_id"], r["step"], r["learner_version"], r["producing_version"], r["staleness"],
             r["n_consumed"]) for r in rows] == [
        (g_none.group_id, 1, 2, 0, 2, 2),
        (g_some.group_id, 1, 2, 1, 1, 2),
        (g_all.group_id, 2, 3, 2, 1, 1),
    ]


def test_composed_views_take_a_plugins_part_and_leave_it_out_on_request(store, populated):
    """Revision 0021: reflexdb's views read what only a method knows through composed views; a
    method (here a plug-in's, by hand) adds a part named <method>_<view> and calls compose_view,
    and untrained_groups and failures show what it says, with no change in reflexdb."""
    run = populated[0]

    def q(sql, **p):
        with store.engine.begin() as conn:
            result = conn.execute(text(sql), p)
            return result.fetchall() if result.returns_rows else []

    assert [r[0] for r in q("SELECT name FROM composed_views ORDER BY name")] == ["failure_notes", "group_hold_ends",
                                                                                 "group_holds"]
    parts = q("SELECT viewname FROM pg_views WHERE viewname LIKE '%\\_group\\_holds' OR viewname LIKE '%\\_failure\\_notes' "
              "ORDER BY 1")
    assert [p[0] for p in parts] == ["lte_group_holds", "r3l_failure_notes"]
    failed = q("SELECT trajectory_id FROM failures WHERE run_id = :r AND root_cause IS NULL "
               "ORDER BY trajectory_id LIMIT 1", r=run)[0][0]
    task = q("SELECT task_id FROM groups WHERE id = :g", g=populated[3].group_id)[0][0]
    rng = np.random.default_rng(5)
    group = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=10, trajectories=[
        make_trajectory(rng, correct=True, reward=1.0)])).group_id  # not trained yet
    assert q("SELECT reason FROM untrained_groups WHERE group_id = :g", g=group) == [("waiting",)]
    try:
        # DDL takes no parameters: the ids are integers of this test
        q(f"CREATE VIEW selfcheck_group_holds AS SELECT CAST({int(group)} AS bigint) AS group_id, "
          "'verifying' AS reason")
        q(f"CREATE VIEW selfcheck_failure_notes AS SELECT id AS trajectory_id, run_id, 'checked itself' AS root_cause "
          f"FROM trajectories WHERE id = {int(failed)}")
        q("SELECT compose_view('group_holds'), compose_view('failure_notes')")
        assert q("SELECT reason FROM untrained_groups WHERE group_id = :g", g=group) == [("verifying",)]
        assert q("SELECT root_cause FROM failures WHERE trajectory_id = :t", t=failed) == [("checked itself",)]
        q("SELECT compose_view('group_holds', 'selfcheck_group_holds'), "
          "compose_view('failure_notes', 'selfcheck_failure_notes')")
        q("DROP VIEW selfcheck_group_holds, selfcheck_failure_notes")  # nothing depends on them any more
        assert q("SELECT reason FROM untrained_groups WHERE group_id = :g", g=group) == [("waiting",)]
        assert q("SELECT root_cause FROM failures WHERE trajectory_id = :t", t=failed) == [(None,)]
    finally:
        q("SELECT compose_view('group_holds', 'selfcheck_group_holds'), "
          "compose_view('failure_notes', 'selfcheck_failure_notes')")
        q("DROP VIEW IF EXISTS selfcheck_group_holds, selfcheck_failure_notes")
    with pytest.raises(Exception, match="not a composed view"):
        q("SELECT compose_view('failures')")
