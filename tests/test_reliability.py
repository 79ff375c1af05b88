"""Nothing lost, nothing skipped, always resumable (docs/reliability.md).

Each defect found by the failure drill (benchmarks/chaos.py) has a test here that fails on the
code before its fix: a group committed after newer ones were trained; a learner started over a
build lock a killed process left; a rerun that trains nothing; a database outage; a publish that
cannot write its files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest

from reflexdb import TaskIn
from reflexdb.db import connect_raw
from reflexdb.trainer.batch import eligible_group_ids

from .processes import REFLEXDB, child_env, rows
from .test_learn import _learner, config_data, seed_groups, tiny_group, write_config


def consumed_groups(store, run: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for step, gid in rows(store, "SELECT s.step, c.group_id FROM consumption c JOIN learner_steps s ON s.id = c.step_id "
                                 "WHERE s.run_id = :r GROUP BY 1, 2 ORDER BY 1, 2", r=run):
        out.setdefault(step, []).append(gid)
    return out


# ------------------------------------------------------------------ 1. groups committed out of id order


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_build_lock_left_by_a_killed_process_is_removed_with_a_message(tmp_path):
    """A learner killed while torch held its extension build lock left the file; every later start
    waited for it forever, printing nothing."""
    ext = _extensions_dir(tmp_path)
    lock = ext / "deepspeed_shm_comm" / "lock"
    lock.touch()  # what a killed holder leaves: the file, and no process holding it
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext), DS_ACCELERATOR="cpu")
    for key in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    out = subprocess.run([sys.executable, "-c", START_DEEPSPEED], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "deepspeed is up" in out.stdout
    assert f"removed a stale build lock left by a killed process: {lock}" in out.stderr
    assert not lock.exists()


@pytest.mark.slow
def test_a_build_lock_held_by_a_live_process_is_waited_for_and_named(tmp_path):
    ext = _extensions_dir(tmp_path)
    lock = ext / "deepspeed_shm_comm" / "lock"
    # A live holder, as torch's FileBaton holds it: the file created exclusively and kept open.
    holder = subprocess.Popen([sys.executable, "-c",
                               f"import os, time; fd = os.open({str(lock)!r}, os.O_CREAT | os.O_EXCL); "
                               "print('held', flush=True); time.sleep(20); os.close(fd); os.remove(" + repr(str(lock)) + ")"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext), DS_ACCELERATOR="cpu")
    for key in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    out = subprocess.run([sys.executable, "-c", START_DEEPSPEED], env=env, capture_output=True, text=True,
                         timeout=300)
    holder.wait(30)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"waiting for process {holder.pid}, which is building DeepSpeed's deepspeed_shm_comm extension" in out.stderr
    assert "removed a stale build lock" not in out.stderr  # a live holder's lock is never taken away


# ------------------------------------------------------------------ 3. a rerun that trains nothing


def _state_files(ckpt: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(ckpt)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(ckpt.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_rerun_that_trains_nothing_publishes_nothing(store, db_url, tmp_path, model_cache):
    """Stopped at an odd step with publish_every 2, then `learn --max-steps N` again: it published
    v+1 with the same weights and rewrote the published state in place (a kill during that rewrite
    left it at 0 bytes, and every later resume printed only `Aborted.`)."""
    seed_groups(store, "learn-test", 8)
    data = config_data(publish_every=2)
    data["max_staleness"] = 100
    cfg = write_config(tmp_path, data)
    env = child_env(db_url, tmp_path, model_cache)
    first = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "3"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    # v1 at step 2 (publish_every), v2 at step 3 (the clean stop publishes what it trained).
    assert rows(store, "SELECT version, step FROM policy_versions ORDER BY 1") == [(0, 0), (1, 2), (2, 3)]
    ckpt = tmp_path / "home" / "checkpoints" / "learn-test"
    before = _state_files(ckpt)
    again = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "3"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed run 'learn-test' at step 3" in again.stderr
    assert "published policy" not in again.stderr
    assert rows(store, "SELECT version, step FROM policy_versions ORDER BY 1") == [(0, 0), (1, 2), (2, 3)]
    assert _state_files(ckpt) == before  # not a byte rewritten
    # Published state is never written again: each version has its own directory.
    assert rows(store, "SELECT count(DISTINCT meta->>'state_tag') FROM policy_versions") == [(3,)]


@pytest.mark.slow
def test_a_damaged_state_stops_resume_with_a_message_not_aborted(store, db_url, tmp_path, model_cache):
    seed_groups(store, "learn-test", 4)
    cfg = write_config(tmp_path, dict(config_data(), max_staleness=100))
    env = child_env(db_url, tmp_path, model_cache)
    first = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "1"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    [(states, tag)] = rows(store, "SELECT meta->>'learner_state', meta->>'state_tag' FROM policy_versions "
                                  "WHERE version = 1")
    [model_states] = Path(states, tag).glob("*model_states.pt")
    model_states.write_bytes(b"")  # what a kill during an in-place rewrite left
    out = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "2"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 1
    assert "the learner state of policy v1 is damaged" in out.stderr and "EOFError" in out.stderr
    assert "Aborted" not in out.stderr and "Traceback" not in out.stderr
    assert rows(store, "SELECT max(step) FROM learner_steps") == [(1,)]  # nothing changed


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_learner_stops_cleanly_when_the_outage_outlasts_its_limit_and_resumes(store, db_url, pg_server_url,
                                                                              tmp_path, model_cache):
    cfg, env, proc = _learner_on_seeded_groups(store, db_url, tmp_path, model_cache, db_retry_s=2, publish_every=2)
    try:
        _wait_for_step(store, proc, 3)
        store.engine.dispose()
        with Outage(pg_server_url, db_url):
            _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 3, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the learner stopped: the database has been unreachable for more than 2s")
    assert "Traceback" not in err
    assert_consistent(store)
    # Started again, it resumes from the last version it published and trains on.
    again = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "6"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert rows(store, "SELECT max(step) FROM learner_steps") == [(6,)]
    assert_consistent(store)


# ------------------------------------------------------------------ 5. disk full, partial files


def _leftovers(ckpt: Path) -> list[str]:
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*")
                  if p.is_dir() and (".tmp-" in p.name or p.name.startswith(".partial-")))


@pytest.mark.slow
@pytest.mark.parametrize("fails_in", ["state", "weights"])
def test_a_publish_that_cannot_write_leaves_no_version_and_resume_starts_from_the_last_one(
        store, tmp_path, monkeypatch, model_cache, fails_in):
    import errno

    from reflexdb.trainer.learner import PublishFailed

    seed_groups(store, "learn-test", 6)
    lr, _ = _learner(store, tmp_path, monkeypatch)
    lr.setup()
    lr.run(max_steps=1)  # v1
    ckpt = lr.ckpt_dir

    def disk_full(*args, **kwargs):  # half a file written, then no space left
        target = Path(str(args[0] if args else kwargs.get("save_dir")))
        target.mkdir(parents=True, exist_ok=True)
        (target / "half-written.bin").write_bytes(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device", str(target / "half-written.bin"))

    if fails_in == "state":
        monkeypatch.setattr(lr.engine.ds, "save_checkpoint", disk_full)
    else:
        monkeypatch.setattr(lr.engine.ds.module, "save_pretrained", disk_full)
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


@pytest.mark.slow
def test_a_state_write_that_fails_at_a_clean_stop_leaves_the_version_as_it_was(store, tmp_path, monkeypatch,
                                                                                 model_cache):
    """``learner.state_every: 3``: v1 is published without a state; at the clean stop its state
    cannot be written (disk full). The stop says so, removes the half-written state, and v1 stays
    a weights-only version: a resume starts from v0's state."""
    import errno

    from reflexdb.trainer.learner import PublishFailed

    seed_groups(store, "learn-test", 4)
    lr, _ = _learner(store, tmp_path, monkeypatch, state_every=3)
    lr.setup()
    lr.run(max_steps=1)  # v0 (with a state), v1 (weights only)
    ckpt = lr.ckpt_dir

    def disk_full(*args, **kwargs):
        target = Path(str(args[0] if args else kwargs.get("save_dir")))
        target.mkdir(parents=True, exist_ok=True)
        (target / "half-written.bin").write_bytes(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device", str(target / "half-written.bin"))

    monkeypatch.setattr(lr.engine.ds, "save_checkpoint", disk_full)
    with pytest.raises(PublishFailed, match=r"writing the learner state of policy v1 failed: No space left on device "
                                            r".*MiB free in .*A resume starts from the newest version with a state"):
        lr.finish()
    assert rows(store, "SELECT version, meta ? 'learner_state' FROM policy_versions ORDER BY 1") == [(0, True),
                                                                                                    (1, False)]
    assert _leftovers(ckpt) == [] and not (ckpt / "states" / "v1").exists()
    assert not lr.last_has_state


@pytest.mark.slow
def test_a_full_file_system_fails_the_publish_cleanly(store, tmp_path, monkeypatch, model_cache):
    """The same on a real size-limited file system (a tmpfs; skipped where mounting is not allowed)."""
    from reflexdb.trainer.learner import PublishFailed

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        seed_groups(store, "learn-test", 6)
        lr, _ = _learner(store, tmp_path, monkeypatch, checkpoint_dir=str(mnt / "ckpt"))
        lr.setup()
        lr.run(max_steps=1)  # v0 and v1 fit
        used = sum(p.stat().st_size for p in mnt.rglob("*") if p.is_file())
        # Room for a bit more than half of one more version: the next publish runs out midway.
        per_version = used // 2
        subprocess.run(["mount", "-o", f"remount,size={used + per_version // 2}", str(mnt)], check=True)
        with pytest.raises(PublishFailed, match=r"publishing policy v2 at step 2 failed: .* MiB free in .*small"):
            lr.run(max_steps=2)
        assert rows(store, "SELECT version FROM policy_versions ORDER BY 1") == [(0,), (1,)]
        assert _leftovers(mnt / "ckpt") == []
        lr2, _ = _learner(store, tmp_path, monkeypatch, checkpoint_dir=str(mnt / "ckpt"))
        lr2.setup()
        assert (lr2.step_no, lr2.version) == (1, 1)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


# ------------------------------------------------------------------ 6. backup and restore of a live run


@pytest.mark.slow
def test_backup_of_a_live_run_restores_and_resumes_with_nothing_lost(store, db_url, pg_server_url, tmp_path,
                                                                     model_cache):
    """docs/operations.md, "Back up a live run": pg_dump while training goes on, a hard-link copy of
    the checkpoints right after; restore into a new database; resume the learner and a collector."""
    from reflexdb import admin
    from reflexdb.db import libpq_url

    from .conftest import _drop_database, _new_database

    cfg = write_config(tmp_path, dict(config_data(keep_states=2, keep_policies=3), max_staleness=1))
    env = child_env(db_url, tmp_path, model_cache)
    ckpt = tmp_path / "home" / "checkpoints" / "learn-test"
    backup = tmp_path / "backup"
    backup.mkdir()
    bin_dir = Path(admin.bin_dir())
    collector = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg)], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    learner = subprocess.Popen(REFLEXDB + ["learn", "-c", str(cfg)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(store, learner, 3)
        # 1. the dump, while training goes on, then at once a hard-link copy of the checkpoints
        dump = backup / "reflexdb.dump"
        subprocess.run([str(bin_dir / "pg_dump"), "-Fc", "-f", str(dump), libpq_url(db_url)], check=True, timeout=120)
        subprocess.run(["cp", "-al", str(ckpt), str(backup / "checkpoints")], check=True)
        # Training goes on after the dump: newer steps and versions, and older states pruned.
        _wait_for_step(store, learner, rows(store, "SELECT max(step) FROM learner_steps")[0][0] + 4)
    finally:
        for p in (learner, collector):
            p.send_signal(signal.SIGTERM)
        for p in (learner, collector):
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()
    assert learner.returncode == 0 and collector.returncode == 0
    # 2. the database is lost; restore the dump into a new one
    name, new_url = _new_database(pg_server_url, None)
    try:
        subprocess.run([str(bin_dir / "pg_restore"), "--no-owner", "--no-privileges", "-d", libpq_url(new_url),
                        str(dump)], check=True, timeout=120)
        from reflexdb import Store

        restored = Store.open(new_url)
        try:
            dumped_groups = rows(restored, "SELECT id, size, policy_version FROM groups ORDER BY id")
            dumped_steps = rows(restored, "SELECT step, policy_version FROM learner_steps ORDER BY step")
            [(version, step, states, tag)] = rows(restored, """
                SELECT version, step, meta->>'learner_state', meta->>'state_tag' FROM policy_versions
                ORDER BY version DESC LIMIT 1""")
            # Up to the dump's snapshot nothing is lost: every group and step it holds is the original's.
            live = set(rows(store, "SELECT id, size, policy_version FROM groups"))
            assert dumped_groups and set(dumped_groups) <= live
            assert set(dumped_steps) <= set(rows(store, "SELECT step, policy_version FROM learner_steps"))
            # 3. the state and weights of the dump's newest version were pruned since: copy back
            #    whatever the live directory lacks (published files are never rewritten: no clobbering)
            assert not (Path(states) / tag).exists() and not (ckpt / f"v{version}").exists()
            subprocess.run(["cp", "-an", f"{backup / 'checkpoints'}/.", str(ckpt)], check=True)
            # 4. resume both on the restored database
            env_new = child_env(new_url, tmp_path, model_cache)
            collector = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg)], env=env_new,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                out = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", str(step + 2)], env=env_new,
                                     capture_output=True, text=True, timeout=600)
            finally:
                collector.send_signal(signal.SIGTERM)
                _, cerr = collector.communicate(timeout=120)
            assert out.returncode == 0, out.stderr[-3000:]
            assert collector.returncode == 0, cerr[-3000:]
            assert f"resumed run 'learn-test' at step {step} (learner state of policy v{version})" in out.stderr
            assert set(dumped_groups) <= set(rows(restored, "SELECT id, size, policy_version FROM groups"))
            assert rows(restored, "SELECT (SELECT max(step) FROM learner_steps), (SELECT max(version) FROM policy_versions)") \
                == [(step + 2, version + 2)]
            assert_consistent(restored)
            from reflexdb.trainer.engine import weights_sha256

            for uri, sha in rows(restored, "SELECT checkpoint_uri, sha256 FROM policy_versions WHERE version > :v",
                                 v=version):
                assert weights_sha256(uri.removeprefix("file://")) == sha  # the new versions, not the lost timeline's
        finally:
            restored.close()
    finally:
        _drop_database(pg_server_url, name)


def test_an_index_that_cannot_be_saved_keeps_working_and_warns(store, tmp_path, caplog):
    """The FAISS files are a cache of the embeddings table: a full or read-only disk must not stop
    the learner's search (nor, for that matter, anything else)."""
    import logging

    from reflexdb.index import EmbeddingIndex

    from .test_index import write_groups as write_embedded_groups

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


@pytest.mark.slow
def test_a_collector_with_an_unwritable_faiss_directory_writes_its_groups(store, tmp_path, monkeypatch, model_cache):
    """Collectors never write the FAISS cache; a home where it cannot be written changes nothing."""
    from reflexdb.collector.engines import make_engine
    from reflexdb.collector.models import resolve_model
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
