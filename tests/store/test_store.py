"""The store API on a real PostgreSQL: round trips, atomicity, concurrency, waits, consumption."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from reflexdb import (
    GroupIn,
    InvalidGroup,
    NotFound,
    ReflexdbError,
    Store,
    TaskIn,
    TrajectoryIn,
    TurnIn,
)
from reflexdb.db import connect_raw
from tests.factories import make_group, setup_run


def _counts(store) -> dict[str, int]:
    return store.table_counts()


def test_round_trip_every_field(store):
    run, (task, *_) = setup_run(store)
    rng = np.random.default_rng(1)
    T = 37
    versions = np.array([3] * 20 + [4] * 17, dtype=np.int32)
    mask = np.zeros(T, dtype=bool)
    mask[5:20] = mask[25:30] = True  # narrower than the assistant spans [0, 20) and [25, 37)
    src = TrajectoryIn(
        prompt_ids=np.arange(9, dtype=np.int64),
        response_ids=rng.integers(0, 49152, T),
        logprobs=-rng.random(T).astype(np.float32) * 7,
        reward=0.25,
        correct=False,
        turns=[
            TurnIn("system", "You are helpful."),
            TurnIn("user", "Add 2 and 3."),
            TurnIn("assistant", "It is 6.", 0, 20),
            TurnIn("observation", "Incorrect. Try again.", 20, 25, tool_error=True),
            TurnIn("assistant", "It is 5. <answer>5</answer> ünïcødé", 25, 37),
        ],
        finish_reason="length",
        extracted_answer="5",
        token_policy_versions=versions,
        loss_mask=mask,
        embedding=rng.standard_normal(24).astype(np.float32),
        error=None,
        meta={"note": "hand-made", "k": [1, 2]},
    )
    written = store.write_group(
        GroupIn(run_id=run, task_id=task, policy_version=4, trajectories=[src], workflow="r3l", kind="retry",
                collector="c1", embedding_model="smollm2", embedding_layer=30, meta={"g": 1})
    )
    [g] = store.read_groups([written.group_id], embeddings=True)
    assert (g.run_id, g.task_id, g.workflow, g.kind, g.policy_version, g.size, g.collector, g.meta) == (
        run, task, "r3l", "retry", 4, 1, "c1", {"g": 1})
    [t] = g.trajectories
    assert t.id == written.trajectory_ids[0]
    assert t.prompt_ids.dtype == np.int32 and np.array_equal(t.prompt_ids, np.arange(9))
    assert t.response_ids.dtype == np.int32 and np.array_equal(t.response_ids, src.response_ids)
    assert t.logprobs.dtype == np.float32 and t.logprobs.tobytes() == src.logprobs.tobytes()
    assert np.array_equal(t.token_policy_versions, versions)
    assert t.loss_mask.dtype == np.bool_ and np.array_equal(t.loss_mask, mask)
    assert t.embedding.dtype == np.float32 and t.embedding.tobytes() == src.embedding.tobytes()
    # The trajectory's version is the oldest that produced a token.
    assert t.policy_version == 3
    assert t.truncated is True and t.finish_reason == "length"
    assert t.reward == 0.25 and t.correct is False and t.extracted_answer == "5"
    # confidence: over the model's own tokens, the assistant spans (not the observation's 20..25)
    own = np.r_[src.logprobs[:20], src.logprobs[25:]].astype(np.float64)
    assert t.confidence == pytest.approx(float(np.exp(np.mean(own))))
    assert t.num_turns == 5 and t.response_length == T and t.times_sampled == 0
    assert t.meta == {"note": "hand-made", "k": [1, 2]}
    assert [(u.role, u.token_start, u.token_end, u.trainable, u.tool_error) for u in t.turns] == [
        ("system", None, None, False, False),
        ("user", None, None, False, False),
        ("assistant", 0, 20, True, False),
        ("observation", 20, 25, False, True),
        ("assistant", 25, 37, True, False),
    ]
    assert t.turns[-1].text.endswith("ünïcødé")
    # read_trajectories gives the same object.
    [again] = store.read_trajectories([t.id], embeddings=True)
    assert again.logprobs.tobytes() == t.logprobs.tobytes() and again.turns == t.turns


def test_default_loss_mask_follows_trainable_turns(store):
    run, (task, *_) = setup_run(store)
    traj = TrajectoryIn(
        response_ids=np.arange(10), logprobs=np.full(10, -0.5, np.float32), reward=1.0, correct=True,
        turns=[TurnIn("assistant", "a", 0, 4), TurnIn("observation", "obs", 4, 6), TurnIn("assistant", "b", 6, 10)],
    )
    w = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=[traj]))
    [t] = store.read_trajectories(w.trajectory_ids)
    assert t.loss_mask.tolist() == [True] * 4 + [False] * 2 + [True] * 4
    assert t.confidence == pytest.approx(np.exp(-0.5))


def test_groups_read_in_requested_order(store):
    run, tasks = setup_run(store)
    rng = np.random.default_rng(0)
    ids = [store.write_group(make_group(rng, run, t, size=3)).group_id for t in tasks]
    groups = store.read_groups(ids[::-1], payloads=False, turns=False)
    assert [g.id for g in groups] == ids[::-1]
    assert all([t.index_in_group for t in g.trajectories] == [0, 1, 2] for g in groups)
    assert groups[0].trajectories[0].logprobs is None  # payloads not asked for
    with pytest.raises(NotFound, match="no group with id 999999"):
        store.read_groups([ids[0], 999999])


def test_write_groups_is_all_or_nothing(store):
    run, (task, *_) = setup_run(store)
    rng = np.random.default_rng(0)
    before = _counts(store)
    good = make_group(rng, run, task)
    bad = make_group(rng, run, 424242)  # no such task: fails inside the transaction, after `good`
    with pytest.raises(InvalidGroup) as err:
        store.write_groups([good, bad])
    assert err.value.field == "task_id"
    assert _counts(store) == before


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import reflexdb.store as st
    from reflexdb import Store
    sys.path.insert(0, {tests!r})
    from factories import make_group

    real_copy = st.copy_rows
    def slow_copy(cur, table, *a, **k):
        real_copy(cur, table, *a, **k)
        if table == "token_bytes":
            print("MIDWAY", flush=True)
            time.sleep(60)
    st.copy_rows = slow_copy
    store = Store.open({url!r})
    store.write_group(make_group(np.random.default_rng(0), {run}, {task}, size=8))
    print("DONE", flush=True)
    """
)


def test_writer_killed_mid_group_leaves_nothing(store, db_url):
    run, (task, *_) = setup_run(store)
    before = _counts(store)
    code = _KILLED_WRITER.format(tests=os.path.dirname(os.path.dirname(__file__)), url=db_url, run=run, task=task)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "MIDWAY"
        # Trajectories, turns and payloads are copied but not committed: invisible to others.
        assert _counts(store) == before
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    # The server aborts the dead backend's transaction; poll until its locks are gone.
    deadline = time.monotonic() + 30
    with connect_raw(db_url, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'reflexdb' "
                           "AND state LIKE 'idle in transaction%'").fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.2)
    assert _counts(store) == before


def _writer(url: str, run: int, task: int, seed: int, n: int, out) -> None:
    store = Store.open(url)
    rng = np.random.default_rng(seed)
    ids = [store.write_group(make_group(rng, run, task, size=8, version=seed)).group_id for _ in range(n)]
    store.close()
    out.put(ids)


def test_four_processes_write_concurrently(store, db_url):
    run, (task, *_) = setup_run(store)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(db_url, run, task, seed, 15, q)) for seed in range(4)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ids = sorted(i for r in results for i in r)
    assert len(ids) == len(set(ids)) == 60
    groups = store.read_groups(ids, turns=False)
    for g in groups:
        assert [t.index_in_group for t in g.trajectories] == list(range(8))
        assert all(t.policy_version == g.policy_version for t in g.trajectories)
    counts = _counts(store)
    assert counts["trajectories"] == counts["token_bytes"] == counts["embeddings"] == 480


def test_tasks_are_idempotent_and_ordered(store):
    run = store.create_run("r")
    assert store.create_run("r") == run
    a = store.add_tasks(run, [TaskIn("p1", "1"), TaskIn("p2", "2", task_key="k2")])
    b = store.add_tasks(run, [TaskIn("p2", "2", task_key="k2"), TaskIn("p3", "3"), TaskIn("p1", "1")])
    assert b[0] == a[1] and b[2] == a[0] and b[1] not in a


def test_settings_round_trip(store):
    run = store.create_run("r")
    store.set_settings(run, {"nexgrpo.conf_low": 0.2, "name": "x", "flag": True})
    store.set_settings(run, {"nexgrpo.conf_low": 0.25})
    assert store.get_settings(run) == {"nexgrpo.conf_low": 0.25, "name": "x", "flag": True}


def test_policy_versions(store):
    run = store.create_run("r")
    assert store.latest_policy(run) is None
    store.publish_policy(run, 0, "file:///ckpt/0", sha256="aa", step=0)
    p = store.publish_policy(run, 1, "file:///ckpt/1", sha256="bb", step=10, meta={"k": 1})
    assert store.latest_policy(run) == p
    assert store.get_policy(run, 0).checkpoint_uri == "file:///ckpt/0"
    with pytest.raises(ReflexdbError, match="already has policy version 1"):
        store.publish_policy(run, 1, "x")
    # The same version again (a retry whose commit was not acknowledged) is the recorded one.
    assert store.publish_policy(run, 1, "file:///ckpt/1", sha256="bb", step=10, meta={"k": 1}) == p
    with pytest.raises(NotFound):
        store.get_policy(run, 7)


def test_wait_for_policy_wakes_on_notify(store):
    run = store.create_run("r")
    store.publish_policy(run, 0, "v0")
    threading.Timer(0.5, lambda: store.publish_policy(run, 1, "v1")).start()
    t0 = time.monotonic()
    # poll_interval far above the delay: only the NOTIFY can wake the waiter this early.
    pv = store.wait_for_policy(run, 0, timeout=20, poll_interval=15)
    assert pv is not None and pv.version == 1
    assert time.monotonic() - t0 < 10


def test_wait_polls_when_no_notification_arrives(store, db_url):
    run, (task, *_) = setup_run(store)
    rng = np.random.default_rng(0)
    # Insert a group by hand without NOTIFY: only the polling fallback can see it.
    g = make_group(rng, run, task, size=1)
    w = store.write_group(g)
    with connect_raw(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO groups (run_id, task_id, policy_version, size) VALUES (%s, %s, 0, 1)", (run, task))
    ids = store.wait_for_groups(run, w.group_id, timeout=10, poll_interval=0.2)
    assert len(ids) == 1 and ids[0] > w.group_id


def test_wait_for_groups_times_out_with_partial(store):
    run, (task, *_) = setup_run(store)
    w = store.write_group(make_group(np.random.default_rng(0), run, task, size=2))
    t0 = time.monotonic()
    ids = store.wait_for_groups(run, 0, min_count=5, timeout=0.5, poll_interval=0.1)
    assert ids == [w.group_id]
    assert time.monotonic() - t0 >= 0.5


def test_record_step_consumption(store, db_url):
    run, (task, *_) = setup_run(store)
    w = store.write_group(make_group(np.random.default_rng(0), run, task, size=4))
    step_id = store.record_step(run, 1, 0, w.trajectory_ids[:3], loss=0.5, metrics={"loss/policy": 0.5})
    store.record_step(run, 2, 1, w.trajectory_ids[:1])
    ts = store.read_trajectories(w.trajectory_ids, payloads=False)
    assert [t.times_sampled for t in ts] == [2, 1, 1, 0]
    with connect_raw(db_url) as conn:
        rows = conn.execute("SELECT trajectory_id, group_id FROM consumption WHERE step_id = %s ORDER BY 1",
                            (step_id,)).fetchall()
    assert rows == [(i, w.group_id) for i in w.trajectory_ids[:3]]
    # The same step with the same trajectories again (a retry whose commit was not acknowledged)
    # is the recorded step; other trajectories under the same step number are an error.
    again = store.record_step(run, 1, 0, w.trajectory_ids[:3])
    assert again == step_id
    with pytest.raises(ReflexdbError, match="already recorded step 2"):
        store.record_step(run, 2, 1, w.trajectory_ids[1:2])
    assert [t.times_sampled for t in store.read_trajectories(w.trajectory_ids, payloads=False)] == [2, 1, 1, 0]
    before = _counts(store)
    with pytest.raises(NotFound, match="1 of the 2"):
        store.record_step(run, 3, 1, [w.trajectory_ids[0], 10**9])
    assert _counts(store) == before  # nothing recorded


def test_embedding_dim_fixed_per_run(store):
    run, (task, *_) = setup_run(store)
    rng = np.random.default_rng(0)
    store.write_group(make_group(rng, run, task, dim=16))
    before = _counts(store)
    with pytest.raises(InvalidGroup) as err:
        store.write_group(make_group(rng, run, task, dim=8))
    assert err.value.field == "trajectories[0].embedding" and "run's embedding dimension 16" in str(err.value)
    assert _counts(store) == before
    # A fresh Store (no cache) checks against the database too.
    other = Store.open(store.url)
    with pytest.raises(InvalidGroup, match="embedding dimension 16"):
        other.write_group(make_group(rng, run, task, dim=8))
    other.close()
    assert _counts(store) == before


def test_embedding_dim_claim_race(store, db_url):
    """A writer blocked on another's first-vector claim sees the committed dimension."""
    run, (task, *_) = setup_run(store)
    other = connect_raw(db_url)  # holds the run row locked with the dimension set, uncommitted
    other.execute("UPDATE runs SET embedding_dim = 16 WHERE id = %s", (run,))
    result = {}

    def write():
        try:
            result["w"] = store.write_group(make_group(np.random.default_rng(0), run, task, dim=16))
        except Exception as exc:  # reported below
            result["err"] = exc

    th = threading.Thread(target=write)
    th.start()
    time.sleep(0.5)
    assert th.is_alive()  # waiting for the row lock
    other.commit()
    other.close()
    th.join(timeout=30)
    assert "err" not in result, result.get("err")
    assert len(result["w"].trajectory_ids) == 4


def test_open_accepts_plain_postgresql_urls(db_url):
    plain = db_url.replace("postgresql+psycopg://", "postgresql://", 1)
    for url in (plain, plain.replace("postgresql://", "postgres://", 1)):
        with Store.open(url) as s:
            assert s.table_counts()["runs"] == 0


def test_write_groups_many_in_one_transaction(store):
    run, tasks = setup_run(store)
    rng = np.random.default_rng(3)
    groups = [make_group(rng, run, t, size=s) for t, s in zip(tasks, (2, 5, 3))]
    listener = connect_raw(store.url, autocommit=True)
    listener.execute("LISTEN reflexdb_groups")
    written = store.write_groups(groups)
    assert [len(w.trajectory_ids) for w in written] == [2, 5, 3]
    assert [w.group_id for w in written] == sorted(w.group_id for w in written)
    notified = [json.loads(n.payload) for n in listener.notifies(timeout=5, stop_after=3)]
    listener.close()
    assert notified == [{"run_id": run, "group_id": w.group_id} for w in written]  # one per group, in order
    back = store.read_groups([w.group_id for w in written], embeddings=True)
    for src, w, g in zip(groups, written, back):
        assert [t.id for t in g.trajectories] == list(w.trajectory_ids)
        for a, b in zip(src.trajectories, g.trajectories):
            assert np.array_equal(a.response_ids, b.response_ids) and a.embedding.tobytes() == b.embedding.tobytes()
            assert b.turns[-1].text == a.turns[-1].text


def test_embedding_dim_not_remembered_from_a_rolled_back_write(store):
    run, (task, *_) = setup_run(store)
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidGroup):  # the 16-d group is rolled back with the bad one
        store.write_groups([make_group(rng, run, task, dim=16), make_group(rng, run, 10**9, dim=16)])
    # The run still has no dimension, so 8-d vectors are accepted (by this same Store too).
    store.write_group(make_group(rng, run, task, dim=8))
    with pytest.raises(InvalidGroup, match="embedding dimension 8"):
        store.write_group(make_group(rng, run, task, dim=16))


def test_large_reads_equal_group_by_group_reads(store):
    """Reads of >= 128 trajectories fetch payloads on two connections; the result is the same."""
    run, tasks = setup_run(store, n_tasks=20)
    rng = np.random.default_rng(4)
    ids = [store.write_group(make_group(rng, run, t, size=8)).group_id for t in tasks]
    together = store.read_groups(ids, embeddings=True)  # 160 trajectories: the parallel path
    assert sum(len(g.trajectories) for g in together) == 160
    for g in together:
        [alone] = store.read_groups([g.id], embeddings=True)  # 8 trajectories: one connection
        for a, b in zip(g.trajectories, alone.trajectories):
            assert a.id == b.id and a.turns == b.turns
            for field in ("prompt_ids", "response_ids", "logprobs", "token_policy_versions", "loss_mask", "embedding"):
                assert getattr(a, field).tobytes() == getattr(b, field).tobytes(), field


def test_a_retried_write_finds_the_group_its_first_attempt_committed(store):
    """The connection can drop after the server committed a group but before the writer heard back;
    the writer's retry of the same GroupIn must not write the group a second time."""
    import dataclasses

    run, (task, *_) = setup_run(store)
    rng = np.random.default_rng(3)
    g = make_group(rng, run, task, size=3)
    first = store.write_group(g)
    before = _counts(store)
    assert store.write_group(g) == first  # the retry: same group, same trajectory ids
    assert _counts(store) == before  # nothing written twice
    [a, b] = [make_group(rng, run, task, size=2), make_group(rng, run, task, size=2)]
    both = store.write_groups([a, b])
    assert store.write_groups([a, b]) == both
    # A key reused for a different write (a GroupIn copied for another group) is refused.
    other = dataclasses.replace(make_group(rng, run, task, size=2), write_key=a.write_key)
    c = make_group(rng, run, task, size=2)
    with pytest.raises(InvalidGroup, match="write_key"):
        store.write_groups([other, c])
    assert _counts(store)["groups"] == before["groups"] + 2
