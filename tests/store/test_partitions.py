"""Runs as partitions (revision 0015): created with the run, holding only its rows, dropped with it."""

from __future__ import annotations

import numpy as np
import pytest

from reflexdb import InvalidGroup, Store, TaskIn, runs, schema
from tests.factories import make_group, make_trajectory, setup_run
from tests.processes import rows
from tests.store.test_roles import roles  # noqa: F401  (the fixture)


def _partitions(store, run_id: int) -> dict[str, str | None]:
    """The run's partitions and each one's storage options."""
    found = rows(store, "SELECT c.relname, array_to_string(c.reloptions, ',') FROM pg_inherits i "
                        "JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relname LIKE :p", p=f"%\\_r{run_id}")
    return dict(found)


def _write(store, name):
    rng = np.random.default_rng(len(name))
    run, tasks = setup_run(store, name)
    written = [store.write_group(make_group(rng, run, t, size=4)) for t in tasks]
    store.record_step(run, 1, 0, written[0].trajectory_ids)
    return run, written


def test_a_run_gets_its_partitions_and_they_hold_only_its_rows(store):
    a, _ = _write(store, "a")
    b, _ = _write(store, "b")
    parts = _partitions(store, a)
    assert set(parts) == {f"{t}_r{a}" for t in schema.PARTITIONED}
    assert parts[f"token_bytes_r{a}"] == "toast_tuple_target=4080"
    for t in ("trajectories", "turns", "token_bytes", "embeddings"):
        [(n_a,)] = rows(store, f"SELECT count(*) FROM {t}_r{a}")
        [(n_b,)] = rows(store, f"SELECT count(*) FROM {t}_r{b}")
        [(n,)] = rows(store, f"SELECT count(*) FROM {t} WHERE run_id = :r", r=a)
        assert n_a == n > 0 and n_b > 0
    plan = "\n".join(r[0] for r in rows(store, f"EXPLAIN SELECT count(*) FROM token_bytes WHERE run_id = {a}"))
    assert f"token_bytes_r{b}" not in plan  # the planner reads one run's partition


def test_deleting_a_run_drops_its_partitions_and_leaves_others(store):
    a, written = _write(store, "a")
    b, _ = _write(store, "b")
    with store.transaction() as conn:
        conn.execute("INSERT INTO reflections (trajectory_id, raw_text, valid, run_id) VALUES (%s, 'x', false, %s)",
                     (written[0].trajectory_ids[0], a))
    before_b = rows(store, "SELECT count(*) FROM trajectories WHERE run_id = :r", r=b)
    with store.transaction() as conn:
        conn.execute(runs.Q["delete_run"], {"run_id": a})
    assert _partitions(store, a) == {}
    assert rows(store, "SELECT count(*) FROM reflections") == [(0,)]
    assert rows(store, "SELECT count(*) FROM runs WHERE id = :r", r=a) == [(0,)]
    assert rows(store, "SELECT count(*) FROM trajectories WHERE run_id = :r", r=b) == before_b
    assert len(_partitions(store, b)) == len(schema.PARTITIONED)


def test_a_plugins_table_that_refers_to_trajectories_is_cleared_with_the_run(store):
    """drop_run_partitions names no method's table (revision 0019): it deletes the run's rows of every
    table with a foreign key to trajectories, by the column that refers to trajectories.run_id, here
    one named otherwise, before it detaches the run's partition (which would fail otherwise)."""
    a, written = _write(store, "a")
    b, written_b = _write(store, "b")
    with store.transaction() as conn:
        conn.execute("CREATE TABLE plugin_notes (note_id bigint, of_trajectory bigint NOT NULL, of_run bigint NOT NULL, "
                     "FOREIGN KEY (of_trajectory, of_run) REFERENCES trajectories (id, run_id))")
        conn.execute("INSERT INTO plugin_notes VALUES (1, %s, %s), (2, %s, %s)",
                     (written[0].trajectory_ids[0], a, written_b[0].trajectory_ids[0], b))
        conn.execute("INSERT INTO purifications (trajectory_id, turn_index, attempts, recovered, run_id) "
                     "VALUES (%s, 1, 1, false, %s)", (written[0].trajectory_ids[1], a))
    try:
        with store.transaction() as conn:
            conn.execute(runs.Q["delete_run"], {"run_id": a})
        assert rows(store, "SELECT note_id FROM plugin_notes") == [(2,)]  # b's row stays
        assert rows(store, "SELECT count(*) FROM purifications") == [(0,)]
        assert _partitions(store, a) == {}
    finally:
        with store.transaction() as conn:
            conn.execute("DROP TABLE plugin_notes")


def test_lineage_is_checked_without_a_foreign_key(store):
    run, written = _write(store, "a")
    rng = np.random.default_rng(1)
    parent = written[0].trajectory_ids[0]
    task = rows(store, "SELECT task_id FROM groups WHERE id = :g", g=written[0].group_id)[0][0]
    ok = store.write_group(make_group(rng, run, task, size=1, parent_trajectory_id=parent, origin="replayed"))
    [(stored,)] = rows(store, "SELECT parent_trajectory_id FROM trajectories WHERE id = :t", t=ok.trajectory_ids[0])
    assert stored == parent
    bad = make_group(rng, run, task, size=2)
    bad.trajectories[1] = make_trajectory(rng, parent_trajectory_id=10**9, origin="replayed")
    [(n,)] = rows(store, "SELECT count(*) FROM trajectories")
    with pytest.raises(InvalidGroup, match=r"trajectories\[1\]\.parent_trajectory_id.*no trajectory with id 1000000000"):
        store.write_group(bad)
    assert rows(store, "SELECT count(*) FROM trajectories") == [(n,)]  # nothing written


def test_a_learner_role_creates_a_run_with_its_partitions_and_a_collector_role_writes_into_them(roles, store):  # noqa: F811
    """Partitions are made by the trigger on ``runs`` (a SECURITY DEFINER function: a role that owns
    no table may add them). Since issue 60 (item 8) the learner role creates runs and the collector
    role may not; the collector then writes into the run's partitions."""
    with Store.open(roles["learner"]) as as_learner:
        run = as_learner.create_run("by-learner")
        as_learner.record_embedding_dim(run, 16, "test-model")  # what the learner does at start
    with Store.open(roles["collector"]) as as_collector:
        [task] = as_collector.add_tasks(run, [TaskIn(prompt="1+1?", ground_truth="2")])
        as_collector.write_group(make_group(np.random.default_rng(0), run, task, size=2))
    assert len(_partitions(store, run)) == len(schema.PARTITIONED)
    assert rows(store, "SELECT count(*) FROM trajectories_r%s" % run) == [(2,)]


def test_runs_created_at_once_by_many_connections_do_not_deadlock(store):
    """Inserting a run creates its partitions, which lock `runs` against every other open insert
    into it; without the advisory lock of create_run two processes creating runs at once deadlocked
    (seen in CI: three collectors creating run "shared")."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    names = ["same"] * 4 + [f"other{i}" for i in range(4)]
    start = threading.Barrier(len(names))
    others = [Store.open(store.url) for _ in names]
    try:
        def create(i):
            start.wait()
            return others[i].create_run(names[i])

        with ThreadPoolExecutor(len(names)) as pool:
            ids = list(pool.map(create, range(len(names))))
    finally:
        for s in others:
            s.close()
    assert len(set(ids[:4])) == 1 and len(set(ids)) == 5
    for rid in set(ids):
        assert set(_partitions(store, rid)) == {f"{t}_r{rid}" for t in schema.PARTITIONED}


def test_a_run_created_while_a_writer_holds_its_tables_gives_way_to_the_writer(store):
    """A writer (B) holds `hints` (a stage of LTE is written before its group) and next wants
    `groups`; the run creation (A) takes `groups` for its partition's foreign key, then waits on
    `hints`. Without a lock timeout on A that is a deadlock, and PostgreSQL might abort the writer;
    with it A gives up within 250 ms, B goes on, and A's retry succeeds."""
    import threading
    import time

    other = Store.open(store.url)
    created: list = []
    try:
        with store.transaction() as conn:
            conn.execute("LOCK TABLE hints IN ROW EXCLUSIVE MODE")  # B's open insert into hints
            t = threading.Thread(target=lambda: created.append(other.create_run("while-writing")))
            t.start()
            time.sleep(0.1)  # A holds groups' lock and waits on hints
            conn.execute("LOCK TABLE groups IN ROW EXCLUSIVE MODE")  # B's insert into groups: no deadlock
        t.join(timeout=60)
    finally:
        other.close()
    [rid] = created
    assert set(_partitions(store, rid)) == {f"{t}_r{rid}" for t in schema.PARTITIONED}
