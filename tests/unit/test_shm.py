"""Published versions in shared memory (reflexdb/shm.py, issue 62): the learner's copies, where
they go, how many stay, room, and which collectors find them (same boot, same host)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import namedtuple

import numpy as np
import pytest

from reflexdb import shm, storage
from reflexdb.config import parse_config

OWNER = storage.Owner("shm-run", 7, "2026-12-01T00:00:00+00:00")


def version(tmp_path, k: int, size: int = 40_000):
    d = tmp_path / "durable" / f"v{k}"
    d.mkdir(parents=True)
    (d / "model-00001-of-00002.safetensors").write_bytes(np.random.default_rng(k).bytes(size))
    (d / "model-00002-of-00002.safetensors").write_bytes(np.random.default_rng(k + 100).bytes(size))
    (d / "config.json").write_text(json.dumps({"k": k}))
    return d, *storage.write_manifest(d)


@pytest.fixture
def copies(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    said = []
    c = shm.SharedCopies(tmp_path / "shm", "shm-run.r7", echo=said.append)
    c.prepare(OWNER)
    c.said = said
    return c


def test_a_copy_is_whole_verified_and_found_by_a_collector_on_this_machine_only(tmp_path, copies, monkeypatch):
    src, sha, man_sha = version(tmp_path, 1)
    meta = {shm.META_KEY: copies.place(src, 1)}
    path = copies.directory / "v1"
    assert meta[shm.META_KEY] == {"path": str(path), "boot_id": shm.boot_id(), "host": shm.identity()["host"]}
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in src.iterdir())
    assert not list(copies.directory.glob("*.tmp-*"))
    assert shm.locate(meta) == path and storage.verify_version(path, sha, man_sha)
    # another boot, another host, a copy gone, a row without one: the durable place
    assert shm.locate({shm.META_KEY: {**meta[shm.META_KEY], "boot_id": "another-boot"}}) is None
    assert shm.locate({shm.META_KEY: {**meta[shm.META_KEY], "host": "elsewhere"}}) is None
    assert shm.locate({shm.META_KEY: {**meta[shm.META_KEY], "path": 3}}) is None
    assert shm.locate({}) is None and shm.locate(None) is None
    shutil.rmtree(path)
    assert shm.locate(meta) is None


def test_the_newest_two_copies_stay_and_the_learner_removes_them_when_it_stops(tmp_path, copies):
    for k in range(1, 5):
        src, _, _ = version(tmp_path, k)
        assert copies.place(src, k) is not None
        copies.prune(k)
        assert sorted(p.name for p in copies.directory.glob("v*")) == [f"v{j}" for j in range(max(1, k - 1), k + 1)]
    copies.remove()
    assert not copies.directory.exists()


def test_a_copy_with_no_room_is_skipped_and_said_once(tmp_path, copies, monkeypatch):
    src, _, _ = version(tmp_path, 1)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 10 << 20))
    assert copies.place(src, 1) is None and copies.place(src, 2) is None
    assert len(copies.said) == 1 and "shared memory: no room for policy v1" in copies.said[0]
    assert not list(copies.directory.glob("v*"))


def test_a_learner_start_removes_its_old_copies_and_the_folders_of_homes_gone(tmp_path, copies):
    src, _, _ = version(tmp_path, 1)
    copies.place(src, 1)
    gone = tmp_path / "shm" / "0123456789ab"
    (gone / "other.r1" / "v3").mkdir(parents=True)
    (gone / shm.HOME_FILE).write_text(str(tmp_path / "a-home-deleted-since"))
    kept = tmp_path / "shm" / "ba9876543210"
    (kept / shm.HOME_FILE).parent.mkdir(parents=True)
    (kept / shm.HOME_FILE).write_text(str(tmp_path))  # a home that exists: other learners'
    dead = subprocess.Popen(["true"])
    dead.wait()
    for run, pid in (("running.r1", os.getpid()), ("crashed.r2", dead.pid)):  # a learner alive, one gone
        (kept / run / "v3").mkdir(parents=True)
        (kept / run / shm.LEARNER_FILE).write_text(json.dumps({"pid": pid, "boot_id": shm.boot_id()}))
    again = shm.SharedCopies(tmp_path / "shm", "shm-run.r7")
    again.prepare(OWNER)
    assert not (copies.directory / "v1").exists() and not gone.exists() and kept.exists()
    assert (kept / "running.r1" / "v3").exists() and not (kept / "crashed.r2" / "v3").exists()
    # another run's folder (its marker) is refused
    with pytest.raises(storage.PrefixOwned):
        shm.SharedCopies(tmp_path / "shm", "shm-run.r7").prepare(storage.Owner("other", 7, "2026-12-02T00:00:00+00:00"))


def test_the_setting_auto_uses_shared_memory_where_its_directory_can_be(tmp_path):
    assert shm.for_run("off", tmp_path, "r.r1") is None
    assert shm.for_run("auto", tmp_path / "missing" / "reflexdb", "r.r1") is None  # no /dev/shm
    auto = shm.for_run("auto", tmp_path / "reflexdb", "r.r1")
    assert auto is not None and not auto.required
    assert shm.for_run("on", tmp_path / "missing" / "reflexdb", "r.r1").required
    cfg = parse_config({"run": "r"})
    assert (cfg.learner.shared_memory_publish, cfg.learner.shared_memory_dir) == ("auto", shm.DEFAULT_DIR)
    assert cfg.learner.publish_shard_mb == 1024 and cfg.collector.checkpoint_fetch_concurrency == 8
