"""The collector work protocol: claims, completion, admission control, liveness."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
from sqlalchemy import text

from reflexdb import Store, TaskIn, work
from tests.factories import make_group


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
    for _ in range(16):
        a = work.admission(store, run, "a", policy_version=0, **kw)
        assert a.allowed and a.staleness <= 1
        store.write_group(make_group(rng, run, tasks[0], size=1))
    a = work.admission(store, run, "a", policy_version=0, **kw)
    assert (a.allowed, a.next_group, a.consume_version, a.staleness) == (False, 16, 2, 2)
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
