"""Reliability with real processes: outages, damaged state, build locks, backups of a live run."""

from __future__ import annotations

import os
import signal
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.processes import REFLEXDB, child_env, rows
from tests.store.test_learn import (
    _learner,
    config_data,
    seed_groups,
    write_config,
)
from tests.store.test_reliability import (  # noqa: F401
    START_DEEPSPEED,
    Outage,
    _extensions_dir,
    _learner_on_seeded_groups,
    _leftovers,
    _state_files,
    _wait_for_step,
    assert_consistent,
)


def test_a_build_lock_held_by_a_live_process_is_waited_for_and_named(tmp_path):
    ext = _extensions_dir(tmp_path)
    lock = ext / "deepspeed_shm_comm" / "lock"
    # A live holder, as torch's FileBaton holds it: the file created exclusively and kept open until
    # the test lets it go (a line on its stdin), not for a fixed time: the waiter's start-up varies.
    holder = subprocess.Popen([sys.executable, "-c",
                               f"import os, sys; fd = os.open({str(lock)!r}, os.O_CREAT | os.O_EXCL); "
                               "print('held', flush=True); sys.stdin.readline(); os.close(fd); "
                               "os.remove(" + repr(str(lock)) + ")"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext), DS_ACCELERATOR="cpu")
        for key in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(key, None)
        waiter = subprocess.Popen([sys.executable, "-c", START_DEEPSPEED], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        told = threading.Event()
        said: list[str] = []

        def read_stderr():
            for line in waiter.stderr:
                said.append(line)
                if f"waiting for process {holder.pid}" in line:
                    told.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            assert told.wait(300), "".join(said)[-2000:]
            # Held a few more of the watcher's looks (1 s apart) while DeepSpeed waits on it: a live
            # holder's lock is never taken for a stale one.
            time.sleep(3)
            assert waiter.poll() is None and lock.exists(), "".join(said)[-2000:]
            holder.stdin.write("done\n")
            holder.stdin.flush()
            holder.wait(30)
            out = waiter.stdout.read()
            waiter.wait(300)
            reader.join(30)
        finally:
            waiter.kill()
    finally:
        holder.kill()
    err = "".join(said)
    assert waiter.returncode == 0, err[-2000:]
    assert "deepspeed is up" in out
    assert f"waiting for process {holder.pid}, which is building DeepSpeed's deepspeed_shm_comm extension" in err
    assert "removed a stale build lock" not in err  # a live holder's lock is never taken away


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


def test_a_full_file_system_fails_the_publish_cleanly(store, tmp_path, monkeypatch, model_cache):
    """The same on a real size-limited file system (a tmpfs; skipped where mounting is not allowed)."""
    from reflexdb.trainer.checkpointer import PublishFailed

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
    ckpt = _run_dir(store, tmp_path)
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


def _run_dir(store, tmp_path, run: str = "learn-test"):
    """The run's own checkpoint directory: $REFLEXDB_HOME/checkpoints/<name>.r<id>."""
    [(run_id,)] = rows(store, "SELECT id FROM runs WHERE name = :n", n=run)
    return tmp_path / "home" / "checkpoints" / f"{run}.r{run_id}"


def test_backup_of_a_live_run_restores_and_resumes_with_nothing_lost(store, db_url, pg_server_url, tmp_path,
                                                                     model_cache):
    """docs/operations.md, "Back up a live run": pg_dump while training goes on, a hard-link copy of
    the checkpoints right after; restore into a new database; resume the learner and a collector."""
    from reflexdb.ops import admin
    from reflexdb.db import libpq_url
    from tests.conftest import _drop_database, _new_database

    cfg = write_config(tmp_path, dict(config_data(keep_states=2, keep_policies=3), max_staleness=1))
    env = child_env(db_url, tmp_path, model_cache)
    backup = tmp_path / "backup"
    backup.mkdir()
    bin_dir = Path(admin.bin_dir())
    collector = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg)], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    learner = subprocess.Popen(REFLEXDB + ["learn", "-c", str(cfg)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(store, learner, 3)
        ckpt = _run_dir(store, tmp_path)
        # 1. the dump, while training goes on, then at once a hard-link copy of the checkpoints
        dump = backup / "reflexdb.dump"
        subprocess.run([str(bin_dir / "pg_dump"), "-Fc", "-f", str(dump), libpq_url(db_url)], check=True, timeout=120)
        copied = subprocess.run(["cp", "-al", str(ckpt), str(backup / "checkpoints")], capture_output=True, text=True)
        # a publish in progress: its temporaries (never named by a row) may vanish under cp (docs/operations.md)
        problems = [line for line in copied.stderr.splitlines() if ".tmp" not in line]
        assert not problems, copied.stderr
        for leftover in (backup / "checkpoints").rglob("*.tmp*"):
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
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
