"""Nothing lost, nothing skipped, always resumable (docs/reliability.md).

Each defect found by the failure drill (benchmarks/chaos.py) has a test here that fails on the
code before its fix: a group committed after newer ones were trained; a learner started over a
build lock a killed process left; a rerun that trains nothing; a database outage; a publish that
cannot write its files.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest
from reflexdb.trainer.batch import eligible_group_ids

from reflexdb import TaskIn
from reflexdb.db import connect_raw
from tests.processes import REFLEXDB, child_env, rows
from tests.store.test_learn import (
    _learner,
    config_data,
    seed_groups,
    tiny_group,
    write_config,
)


def consumed_groups(store, run: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for step, gid in rows(store, "SELECT s.step, c.group_id FROM consumption c JOIN learner_steps s ON s.id = c.step_id "
                                 "WHERE s.run_id = :r GROUP BY 1, 2 ORDER BY 1, 2", r=run):
        out.setdefault(step, []).append(gid)
    return out


# ------------------------------------------------------------------ 1. groups committed out of id order


def test_a_group_committed_after_newer_ones_were_trained_is_still_trained(store, tmp_path, monkeypatch, model_cache):
    """A writer that stalls inside its transaction commits group N after N+1.. were trained. The
    learner once advanced a "skip below this id" mark after each step and never took N."""
    from reflexdb import store as store_module

    lr, _ = _learner(store, tmp_path, monkeypatch)  # creates run 'learn-test'; 2 groups a step
    run = lr.run_id
    tasks = store.add_tasks(run, [TaskIn(f"What is {i} + 1?", str(i + 1)) for i in range(6)])
    rng = np.random.default_rng(0)
    stalled, release = threading.Event(), threading.Event()
    real_copy = store_module._Rows.copy

    def copy(self, cur):  # the slow writer stops inside its transaction, after its group got its id
        if threading.current_thread().name == "slow-writer":
            stalled.set()
            release.wait(120)
        real_copy(self, cur)

    monkeypatch.setattr(store_module._Rows, "copy", copy)
    slow_group = tiny_group(rng, run, tasks[0])
    written = {}
    writer = threading.Thread(target=lambda: written.update(w=store.write_group(slow_group)), name="slow-writer")
    writer.start()
    assert stalled.wait(30)
    later = [store.write_group(tiny_group(rng, run, t)).group_id for t in tasks[1:]]
    lr.setup()
    lr.run(max_steps=1)  # trains the two oldest committed groups
    release.set()
    writer.join(30)
    n = written["w"].group_id
    assert n < later[0]  # the stalled group's id is older than every group trained so far
    lr.run(max_steps=2)
    taken = consumed_groups(store, run)
    assert taken[1] == later[:2]
    assert taken[2] == sorted([n, later[2]])  # the late group, then the oldest left
    assert rows(store, "SELECT count(*) FROM untrained_groups WHERE reason = 'passed_over'") == [(0,)]


def test_untrained_groups_says_why_each_group_was_not_trained(store, db_url):
    """Hand-made history: each reason of the view, from recorded snapshots (max_staleness 0)."""
    run = store.create_run("why")
    store.set_settings(run, {"learner.max_staleness": 0})
    [task] = store.add_tasks(run, [TaskIn("q", "1")])
    rng = np.random.default_rng(1)
    store.publish_policy(run, 0, "file:///v0")
    g1, g2, g3 = (store.write_group(tiny_group(rng, run, task, G=2)) for _ in range(3))
    r5, r6 = (store.write_group(tiny_group(rng, run, task, G=2, kind="replay")) for _ in range(2))
    # g4's writer is stalled in its transaction while steps 1 and 2 choose their groups.
    conn = connect_raw(db_url)
    g4 = conn.execute("INSERT INTO groups (run_id, task_id, policy_version, size) VALUES (%s, %s, 0, 1) RETURNING id",
                      (run, task)).fetchone()[0]
    step1 = eligible_group_ids(store, run, 1)
    assert step1.group_ids == [g1.group_id]
    store.record_step(run, 1, 0, g1.trajectory_ids, batch_snapshot=step1.snapshot)
    # Step 2 (a defect, made by hand) takes the newer replay group r6 although r5 was there.
    step2 = eligible_group_ids(store, run, 1)
    store.record_step(run, 2, 0, r6.trajectory_ids, batch_snapshot=step2.snapshot)
    conn.commit()
    conn.close()
    store.publish_policy(run, 1, "file:///v1")  # every version-0 group is now stale
    g7 = store.write_group(tiny_group(rng, run, task, G=2, version=1))
    store.write_group(tiny_group(rng, run, task, G=2, version=1, kind="eval"))  # never training data
    got = dict(rows(store, "SELECT group_id, reason FROM untrained_groups WHERE run_id = :r", r=run))
    assert got == {g2.group_id: "backlog", g3.group_id: "backlog",  # seen, but older groups came first
                   r5.group_id: "passed_over",  # seen, and a newer group of its queue was taken instead
                   g4: "late",  # committed after the last step that could have taken it
                   g7.group_id: "waiting"}  # eligible: a coming step takes it
    counts = dict(rows(store, "SELECT group_id, steps_that_could_take FROM untrained_groups WHERE run_id = :r", r=run))
    assert counts[g2.group_id] == 2 and counts[g4] == 0 and counts[r5.group_id] == 2


# ------------------------------------------------------------------ 2. torch's extension build lock


def _extensions_dir(tmp_path) -> Path:
    """A private TORCH_EXTENSIONS_DIR, seeded with this machine's build of DeepSpeed's op when there
    is one (else DeepSpeed builds it: slower, same behaviour)."""
    import shutil

    from reflexdb.trainer.buildlock import extensions_root

    ext = tmp_path / "torch_extensions"
    built = extensions_root() / "deepspeed_shm_comm"
    if (built / "deepspeed_shm_comm.so").exists():
        shutil.copytree(built, ext / "deepspeed_shm_comm", ignore=shutil.ignore_patterns("lock"))
    else:
        (ext / "deepspeed_shm_comm").mkdir(parents=True)
    return ext


START_DEEPSPEED = ("from reflexdb.trainer.engine import init_distributed; init_distributed('cpu'); "
                   "print('deepspeed is up', flush=True)")


# ------------------------------------------------------------------ 3. a rerun that trains nothing


def _state_files(ckpt: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(ckpt)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(ckpt.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ 4. database outages


class Outage:
    """Make one test database unreachable (new connections refused, open ones terminated) and back."""

    def __init__(self, pg_server_url: str, db_url: str):
        from sqlalchemy.engine import make_url

        self.admin = pg_server_url.replace("postgresql+psycopg://", "postgresql://", 1)
        self.name = make_url(db_url).database

    def __enter__(self) -> Outage:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false')
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (self.name,))
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')


def assert_consistent(store) -> None:
    """The invariants of docs/reliability.md that a single learner's history must keep."""
    steps = [s for (s,) in rows(store, "SELECT step FROM learner_steps ORDER BY 1")]
    assert steps == list(range(1, len(steps) + 1))  # contiguous
    versions = [v for (v,) in rows(store, "SELECT version FROM policy_versions ORDER BY 1")]
    assert versions == list(range(len(versions)))
    assert rows(store, "SELECT count(*) FROM trajectories t WHERE times_sampled <> "
                       "(SELECT count(*) FROM consumption c WHERE c.trajectory_id = t.id)") == [(0,)]
    assert rows(store, "SELECT count(*) FROM trajectories WHERE times_sampled > 1") == [(0,)]  # max_reuse 1
    # Every published version's step was recorded (nothing published that was not recorded).
    assert rows(store, "SELECT count(*) FROM policy_versions p WHERE p.step > 0 AND NOT EXISTS "
                       "(SELECT 1 FROM learner_steps s WHERE s.run_id = p.run_id AND s.step = p.step)") == [(0,)]


def _wait_for_step(store, proc, n: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while rows(store, "SELECT count(*) FROM learner_steps") < [(n,)]:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _learner_on_seeded_groups(store, db_url, tmp_path, model_cache, **learner):
    """24 seeded groups and a `reflexdb learn --max-steps 10` process on them; return (config, env, process)."""
    seed_groups(store, "learn-test", 24)
    cfg = write_config(tmp_path, dict(config_data(**learner), max_staleness=100))
    env = child_env(db_url, tmp_path, model_cache)
    proc = subprocess.Popen(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "10"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return cfg, env, proc


def test_the_learner_rides_out_a_database_outage(store, db_url, pg_server_url, tmp_path, model_cache):
    """A short outage used to kill the learner with a multi-line traceback."""
    _, _, proc = _learner_on_seeded_groups(store, db_url, tmp_path, model_cache, db_retry_s=120)
    try:
        _wait_for_step(store, proc, 3)
        store.engine.dispose()
        with Outage(pg_server_url, db_url):
            time.sleep(8)
            assert proc.poll() is None  # still waiting, not dead
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "database unreachable" in err and "database is back after" in err
    assert "Traceback" not in err
    assert rows(store, "SELECT (SELECT max(step) FROM learner_steps), (SELECT max(version) FROM policy_versions)") == [(10, 10)]
    assert_consistent(store)


# ------------------------------------------------------------------ 5. disk full, partial files


def _leftovers(ckpt: Path) -> list[str]:
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*")
                  if p.is_dir() and (".tmp-" in p.name or p.name.startswith(".partial-")))


def _disk_full(*args, **kwargs):
    """A checkpoint write that leaves half a file, then finds no space left."""
    import errno

    target = Path(str(args[0] if args else kwargs.get("save_dir")))
    target.mkdir(parents=True, exist_ok=True)
    (target / "half-written.bin").write_bytes(b"\0" * 1000)
    raise OSError(errno.ENOSPC, "No space left on device", str(target / "half-written.bin"))


@pytest.mark.parametrize("fails_in", ["state", "weights"])
def test_a_publish_that_cannot_write_leaves_no_version_and_resume_starts_from_the_last_one(
        store, tmp_path, monkeypatch, model_cache, fails_in):
    from reflexdb.trainer.checkpointer import PublishFailed

    seed_groups(store, "learn-test", 6)
    lr, _ = _learner(store, tmp_path, monkeypatch)
    lr.setup()
    lr.run(max_steps=1)  # v1
    ckpt = lr.ckpt_dir

    if fails_in == "state":
        monkeypatch.setattr(lr.engine.ds, "save_checkpoint", _disk_full)
    else:
        monkeypatch.setattr(lr.engine.ds.module, "save_pretrained", _disk_full)
    with pytest.raises(PublishFailed, match=r"publishing policy v2 at step 2 failed: No space left on device .*"
                                            r"MiB free in .* resumes from policy v1 \(step 1\)"):
        lr.run(max_steps=2)
    assert rows(store, "SELECT version FROM policy_versions ORDER BY 1") == [(0,), (1,)]
    assert _leftovers(ckpt) == []
    assert not (ckpt / "v2").exists() and not (ckpt / "states" / "v2").exists()
    lr2, msgs = _learner(store, tmp_path, monkeypatch)
    lr2.setup()
    assert (lr2.step_no, lr2.version) == (1, 1)
    assert any("rolled back 1 unpublished step" in m for m in msgs)
    lr2.run(max_steps=2)
    assert rows(store, "SELECT version, step FROM policy_versions ORDER BY 1") == [(0, 0), (1, 1), (2, 2)]


def test_a_background_publish_that_cannot_write_fails_the_run_and_leaves_no_version(store, tmp_path, monkeypatch,
                                                                                   model_cache):
    """``learner.publish_in_background`` (the default): v1, weights only, is written by the writer
    thread and finds the disk full. The run raises :class:`PublishFailed` when it waits for the
    write (here at its end; else at the next publish), no row names v1, nothing half-written is
    left, and a resume starts from v0."""
    from reflexdb.trainer.checkpointer import PublishFailed

    seed_groups(store, "learn-test", 4)
    lr, _ = _learner(store, tmp_path, monkeypatch, state_every=100)
    lr.setup()  # v0, with the learner state: in the foreground
    assert lr.checkpoints.background
    monkeypatch.setattr(lr.engine.ds.module, "save_pretrained", _disk_full)
    with pytest.raises(PublishFailed, match=r"publishing policy v1 at step 1 failed: No space left on device .*"
                                            r"resumes from policy v0 \(step 0\)"):
        lr.run(max_steps=1)
    assert rows(store, "SELECT version FROM policy_versions ORDER BY 1") == [(0,)]
    assert _leftovers(lr.ckpt_dir) == [] and not (lr.ckpt_dir / "v1").exists()


def test_a_state_write_that_fails_at_a_clean_stop_leaves_the_version_as_it_was(store, tmp_path, monkeypatch,
                                                                                 model_cache):
    """``learner.state_every: 3``: v1 is published without a state; at the clean stop its state
    cannot be written (disk full). The stop says so, removes the half-written state, and v1 stays
    a weights-only version: a resume starts from v0's state."""
    from reflexdb.trainer.checkpointer import PublishFailed

    seed_groups(store, "learn-test", 4)
    lr, _ = _learner(store, tmp_path, monkeypatch, state_every=3)
    lr.setup()
    lr.run(max_steps=1)  # v0 (with a state), v1 (weights only)
    ckpt = lr.ckpt_dir

    monkeypatch.setattr(lr.engine.ds, "save_checkpoint", _disk_full)
    with pytest.raises(PublishFailed, match=r"writing the learner state of policy v1 failed: No space left on device "
                                            r".*MiB free in .*A resume starts from the newest version with a state"):
        lr.finish()
    assert rows(store, "SELECT version, meta ? 'learner_state' FROM policy_versions ORDER BY 1") == [(0, True),
                                                                                                    (1, False)]
    assert _leftovers(ckpt) == [] and not (ckpt / "states" / "v1").exists()
    assert not lr.checkpoints.last_has_state


# ------------------------------------------------------------------ 6. backup and restore of a live run


def test_an_index_that_cannot_be_saved_keeps_working_and_warns(store, tmp_path, caplog):
    """The FAISS files are a cache of the embeddings table: a full or read-only disk must not stop
    the learner's search (nor, for that matter, anything else)."""
    import logging

    from reflexdb.index import EmbeddingIndex
    from tests.store.test_index import write_groups as write_embedded_groups

    run = store.create_run("faiss-full")
    tasks = store.add_tasks(run, [TaskIn(f"q{i}", "1") for i in range(3)])
    ids = write_embedded_groups(store, run, tasks, np.random.default_rng(0), 3)
    blocked = tmp_path / "faiss"
    blocked.write_text("a file where the index directory should be")  # nothing can be written under it
    index = EmbeddingIndex.open(store, run, directory=blocked / "sub")
    with caplog.at_level(logging.WARNING, logger="reflexdb.index"):
        assert index.catch_up() == len(ids)
    assert "could not save the FAISS index" in caplog.text
    hits = index.search_trajectory(ids[0], k=2)  # searching works from memory
    assert len(hits) == 2 and ids[0] not in [h.trajectory_id for h in hits]


def test_a_collector_with_an_unwritable_faiss_directory_writes_its_groups(store, tmp_path, monkeypatch, model_cache):
    """Collectors never write the FAISS cache; a home where it cannot be written changes nothing."""
    from reflexdb.collector.engines import make_engine
    from reflexdb.models import resolve_model
    from reflexdb.collector.runner import Collector

    from reflexdb.config import parse_config

    home = tmp_path / "home"
    home.mkdir()
    (home / "faiss").write_text("not a directory")
    monkeypatch.setenv("REFLEXDB_HOME", str(home))
    engine = make_engine("hf", model=resolve_model("tiny"), device="cpu")
    cfg = parse_config({"run": "no-faiss", "model": "tiny",
                        "collector": {"group_size": 3, "sampling": {"max_new_tokens": 4}}})
    c = Collector(cfg, store, engine, echo=lambda msg: None)
    c.setup()
    assert c.run(max_groups=2).groups == 2
    assert rows(store, "SELECT (SELECT count(*) FROM groups), (SELECT count(*) FROM embeddings)") == [(2, 6)]
