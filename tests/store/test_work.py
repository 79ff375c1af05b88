"""The collector work protocol: claims, completion, admission control, liveness."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
from sqlalchemy import text

from reflexdb import Store, TaskIn, work
from tests.factories import make_group
from tests.processes import rows


def _setup(store, n_tasks=10):
    run = store.create_run("w")
    tasks = store.add_tasks(run, [TaskIn(f"q{i}", str(i)) for i in range(n_tasks)])
    return run, tasks


def test_claims_are_exclusive_until_completed_or_released(store):
    run, tasks = _setup(store, 4)
    a = work.claim_tasks(store, run, "a", 3)
    b = work.claim_tasks(store, run, "b", 3)
    assert len(a) == 3 and len(b) == 1
    assert not {t.id for t in a} & {t.id for t in b}
    assert work.claim_tasks(store, run, "c", 3) == []
    # Completing with a group releases and counts; the task comes back in the next epoch only.
    w = store.write_group(make_group(np.random.default_rng(0), run, a[0].id), complete_claim="a")
    assert w.group_id
    work.release_claims(store, run, "b")
    again = work.claim_tasks(store, run, "c", 5)
    assert {t.id for t in again} == {b[0].id, a[0].id}
    assert [t.times_collected for t in again] == [0, 1]  # least-collected first
    assert work.claim_tasks(store, run, "d", 5, max_collections=1) == []


def test_soft_retirement_reads_the_view_its_method_names(store):
    """reflexdb's claim names no method's view: the workflow passes the one that lists retired tasks."""
    import pytest

    run, tasks = _setup(store, 3)
    with pytest.raises(ValueError, match="needs the view that lists the retired tasks"):
        work.claim_tasks(store, run, "a", 1, retire_prob=0.5)
    with store.transaction() as conn:
        conn.execute("CREATE VIEW every_task_retired AS SELECT id AS task_id FROM tasks")
    try:
        got = work.claim_tasks(store, run, "a", 3, retire_prob=1.0, retired="every_task_retired")
        assert len(got) == 3 and all(t.retired for t in got)  # ε = 1: kept, and seen as retired
    finally:
        with store.transaction() as conn:
            conn.execute("DROP VIEW every_task_retired")
    assert [t.retired for t in work.claim_tasks(store, run, "b", 3)] == []  # all held by a
    work.release_claims(store, run, "a")
    assert not any(t.retired for t in work.claim_tasks(store, run, "b", 3))  # no soft retirement: never looked up


def test_complete_claim_only_counts_own_claim(store):
    run, tasks = _setup(store, 1)
    [t] = work.claim_tasks(store, run, "a")
    store.write_group(make_group(np.random.default_rng(0), run, t.id), complete_claim="intruder")
    with store.engine.connect() as conn:
        claimed_by, n = conn.execute(text("SELECT claimed_by, times_collected FROM tasks WHERE id = :i"),
                                     {"i": t.id}).one()
    assert (claimed_by, n) == ("a", 0)


def test_abandoned_claims_expire(store):
    run, tasks = _setup(store, 1)
    assert work.claim_tasks(store, run, "dead", 1)
    assert work.claim_tasks(store, run, "b", 1, claim_ttl_s=3600) == []
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE tasks SET claimed_at = now() - interval '2 hours'"))
    assert len(work.claim_tasks(store, run, "b", 1, claim_ttl_s=3600)) == 1


def _claimer(url, run, name, ready, start, out):
    store = Store.open(url)
    got = []
    ready.put(name)
    start.wait(60)
    while True:
        claimed = work.claim_tasks(store, run, name, 2, max_collections=1)
        if not claimed:
            break
        for t in claimed:
            got.append(t.id)
            time.sleep(0.02)  # "generation": lets the two collectors interleave
            store.write_group(make_group(np.random.default_rng(t.id), run, t.id, size=2), complete_claim=name)
    store.close()
    out.put(got)


def test_two_processes_never_duplicate_claims(store, db_url):
    run, tasks = _setup(store, 40)
    ctx = mp.get_context("spawn")
    q, ready, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_claimer, args=(db_url, run, f"c{i}", ready, start, q)) for i in range(2)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)  # both connected
    start.set()
    got = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(got), "both collectors should have done some work"
    flat = got[0] + got[1]
    assert sorted(flat) == sorted(tasks)  # every task exactly once
    with store.engine.connect() as conn:
        per_task = conn.execute(text("SELECT task_id, count(*) FROM groups GROUP BY 1")).all()
    assert len(per_task) == 40 and all(n == 1 for _, n in per_task)


def test_admission_bounds_staleness(store):
    run, tasks = _setup(store, 30)
    rng = np.random.default_rng(0)
    kw = dict(eta=1, groups_per_step=4, publish_every=2)
    # Groups 0..15 are consumed by steps 0..3, i.e. versions 0..1: a v0 collector may make them.
    for i in range(16):
        a = work.admission(store, run, "a", policy_version=0, **kw)
        assert a.allowed and a.staleness <= 1
        assert a.room == 16 - i  # how many may start now: a batch of tasks claims no more
        store.write_group(make_group(rng, run, tasks[0], size=1))
    a = work.admission(store, run, "a", policy_version=0, **kw)
    assert (a.allowed, a.next_group, a.consume_version, a.staleness, a.room) == (False, 16, 2, 2, 0)
    assert work.admission(store, run, "a", policy_version=1, **kw).room == 8  # groups 16..23: steps 4, 5 (v2)
    assert work.admission(store, run, "a", policy_version=1, **kw).allowed
    # Another collector's in-flight claims count as groups about to be written.
    work.claim_tasks(store, run, "b", 8)
    assert not work.admission(store, run, "a", policy_version=1, **kw).allowed
    assert work.admission(store, run, "b", policy_version=1, **kw).allowed  # its own claims don't


def test_collector_registry(store):
    run, _ = _setup(store, 1)
    cid = work.register_collector(store, run, "c1", engine="hf", model="tiny", policy_version=0)
    work.report_progress(store, cid, policy_version=1, groups=2, trajectories=16, tokens=900, skipped_rows=3)
    work.report_progress(store, cid, policy_version=2, groups=1, trajectories=8, tokens=100, reward_errors=1)
    work.mark_stopped(store, cid)
    assert work.register_collector(store, run, "c1", engine="hf", model="tiny", policy_version=2) == cid
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT status, policy_version, groups_written, trajectories_written, "
                                "tokens_generated, reward_errors, skipped_rows FROM collectors")).one()
    assert tuple(row) == ("running", 2, 3, 24, 1000, 1, 3)


# ---------------------------------------------------------------- a method's groups that no step takes

#: A method's view of the groups it never trains (Method.drops), as a plug-in's migration makes it:
#: its part of the composed view group_holds, here every group whose meta says drop, or, in a run
#: named "sevenths...", every seventh group by id.
DROPS = """
CREATE VIEW test_group_holds AS
SELECT g.id AS group_id, 'dropped'::text AS reason FROM groups g
WHERE g.meta->>'drop' = 'yes' OR (g.id % 7 = 0 AND g.run_id IN (SELECT id FROM runs WHERE name LIKE 'sevenths%'));
SELECT compose_view('group_holds');
"""


def _drops_view(store) -> str:
    with store.transaction() as conn:
        conn.execute(DROPS)
    return "test_group_holds"


def test_admission_does_not_count_the_groups_the_method_never_trains(store):
    """Issue 60, item 2: a group the method's batch rule drops moves no other group to a later step."""
    run, tasks = _setup(store, 8)
    drops = _drops_view(store)
    rng = np.random.default_rng(0)
    kw = dict(eta=1, groups_per_step=2, publish_every=1)
    for i in range(4):  # places 0..3 (steps 0 and 1: versions 0 and 1) for a v0 collector; one is dropped
        g = make_group(rng, run, tasks[i], size=2)
        g.meta = {"drop": "yes"} if i == 1 else {}
        store.write_group(g)
    counted_all = work.admission(store, run, "a", policy_version=0, **kw)
    assert (counted_all.allowed, counted_all.next_group, counted_all.room) == (False, 4, 0)
    a = work.admission(store, run, "a", policy_version=0, drops=drops, **kw)
    assert (a.allowed, a.next_group, a.consume_version, a.staleness, a.room) == (True, 3, 1, 1, 1)
    store.write_group(make_group(rng, run, tasks[4], size=2))
    assert not work.admission(store, run, "a", policy_version=0, drops=drops, **kw).allowed
    # the learner's default batch rule leaves the same groups out
    from reflexdb.trainer.batch import eligible_group_ids

    store.set_settings(run, {"learner.max_staleness": 1})
    kept = [g for (g,) in rows(store, "SELECT id FROM groups WHERE run_id = :r AND meta->>'drop' IS NULL "
                                      "ORDER BY id", r=run)]
    assert eligible_group_ids(store, run, 8, drops=drops).group_ids == kept
    assert len(eligible_group_ids(store, run, 8).group_ids) == 5


def _collect_and_learn(store, run, task, drops_for_admission, steps=50, G=2):
    """A collector and a learner taking turns on the store, as the processes do, at max_staleness 1
    and a version per step, under a batch rule that never trains every seventh group: each turn the
    collector writes what admission lets it (at most a batch of 2) and the learner takes a step if
    ``G`` groups are eligible. Returns the steps taken before neither could go on (or ``steps``)."""
    from reflexdb.trainer.batch import eligible_group_ids

    rng = np.random.default_rng(0)
    store.set_settings(run, {"learner.max_staleness": 1, "learner.groups_per_step": G, "learner.publish_every": 1})
    store.publish_policy(run, 0, "file:///v0")
    trajectories: dict[int, tuple[int, ...]] = {}
    version = step = 0
    while step < steps:
        a = work.admission(store, run, "c", policy_version=version, eta=1, groups_per_step=G, publish_every=1,
                           drops=drops_for_admission)
        for _ in range(min(a.room, 2)):
            w = store.write_group(make_group(rng, run, task, size=2, version=version))
            trajectories[w.group_id] = w.trajectory_ids
        chosen = eligible_group_ids(store, run, G, min_version=version - 1, drops="test_group_holds")
        if len(chosen.group_ids) < G:
            if not a.room:
                return step  # each waits for the other
            continue
        step += 1
        store.record_step(run, step, version, [t for g in chosen.group_ids for t in trajectories[g]],
                          batch_snapshot=chosen.snapshot)
        version += 1
        store.publish_policy(run, version, f"file:///v{version}", step=step)
    return step


def test_fifty_steps_at_max_staleness_1_when_every_seventh_group_is_dropped(store):
    """Issue 60, item 2: with the dropped groups counted, the collector waits for a version the
    learner cannot train (it waits for groups) within a few steps; left out, 50 steps go through, no
    dropped group is trained, none is stale, and untrained_groups gives the method's reason."""
    run = store.create_run("sevenths")
    [task] = store.add_tasks(run, [TaskIn("q", "1")])
    drops = _drops_view(store)
    assert _collect_and_learn(store, run, task, drops) == 50
    got = dict(rows(store, "SELECT reason, count(*) FROM untrained_groups WHERE run_id = :r GROUP BY 1", r=run))
    dropped = rows(store, "SELECT count(*) FROM groups g JOIN test_group_holds h ON h.group_id = g.id "
                          "WHERE g.run_id = :r", r=run)[0][0]
    assert dropped >= 14 and got["dropped"] == dropped and set(got) <= {"dropped", "waiting"}  # never passed_over
    assert rows(store, "SELECT count(*) FROM consumption c JOIN test_group_holds h USING (group_id)") == [(0,)]
    assert rows(store, "SELECT max(staleness) FROM staleness WHERE run_id = :r", r=run) == [(1,)]

    other = store.create_run("sevenths, counted")  # the same, with admission counting every group (main)
    [task] = store.add_tasks(other, [TaskIn("q", "1")])
    assert _collect_and_learn(store, other, task, None) < 15  # stuck: 7 steps here


def test_a_drops_view_that_cannot_be_read_stops_the_start_with_its_name(store):
    import pytest

    from reflexdb.errors import ReflexdbError

    work.check_drops(store, "grpo", None)  # nothing declared: nothing to check
    work.check_drops(store, "mine", _drops_view(store))
    with pytest.raises(ReflexdbError, match=r"method 'mine' declares the groups it never trains in 'mine_drops' "
                                            r"\(Method.drops\), but the database has no such view: its migration "
                                            r"branch creates it \(run `reflexdb db upgrade`"):
        work.check_drops(store, "mine", "mine_drops")
    with store.transaction() as conn:
        conn.execute("CREATE VIEW mine_drops AS SELECT id FROM groups")
    with pytest.raises(ReflexdbError, match="'mine_drops' .* but it has no column group_id"):
        work.check_drops(store, "mine", "mine_drops")
