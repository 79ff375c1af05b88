"""Publishing to S3 and loading from it, through a real S3 server (moto's, tests/s3server.py) and
a real database: the learner's checkpointer uploads a version, then records the row naming it; a
collector's cache fetches what the row names and checks it; pruning reaches storage; storage that
stops answering makes the publish wait and retry, then fail with the URL and the cause, with no
row recorded."""

from __future__ import annotations

import json
import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from reflexdb import storage
from reflexdb.collector.evaluate import resolve_checkpoint
from reflexdb.config import parse_config
from reflexdb.trainer.checkpointer import Checkpointer, PublishFailed
from tests.processes import rows
from tests.s3server import S3Server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    server.make_bucket("ckpt")
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return s3


#: 1-s timeouts, one try per call: a stopped server fails a call in about a second (s3fs itself
#: would try each call 5 times, riding out a short outage before reflexdb's retries see it)
FAIL_FAST = {"config_kwargs": {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 1}}}


@pytest.fixture
def fail_fast(monkeypatch):
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    return FAIL_FAST


class FakeEngine:
    """What the checkpointer asks of the training engine, writing small weights that change each publish."""

    settings = SimpleNamespace(zero_stage=0)

    def __init__(self):
        self.calls = 0

    def snapshot_weights(self):
        return {"n": self.calls}

    def export_hf(self, out_dir, state_dict=None):
        self.calls += 1
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "model.safetensors").write_bytes(np.random.default_rng(self.calls).bytes(300_000))
        (out_dir / "config.json").write_text(json.dumps({"calls": self.calls}))
        return storage.weights_sha256(out_dir)

    def save_state(self, directory, tag, client_state):
        (directory / tag).mkdir(parents=True, exist_ok=True)


def checkpointer(store, tmp_path, url, *, background=False, retry_s=30.0, options=None, said=None):
    run_id = store.create_run("s3-run")
    ck = Checkpointer(store, run_id, "s3-run", tmp_path / "learner-ckpt", FakeEngine(), state_every=100, keep_states=1,
                      keep_policies=2, main=True, db=lambda fn: fn(), echo=(said if said is not None else []).append,
                      background=background, url=url, storage_options=options, upload_retry_s=retry_s)
    ck.prepare()
    return ck, run_id


@pytest.mark.parametrize("background", [False, True])
def test_publish_to_s3_then_load_what_the_row_names(store, tmp_path, s3_env, background, monkeypatch):
    url = f"s3://ckpt/run-{background}/"
    said = []
    ck, run_id = checkpointer(store, tmp_path, url, background=background, said=said,
                              options={"endpoint_url": s3_env.endpoint})
    for step in range(4):
        ck.publish(step)
    ck.close()
    versions = rows(store, "SELECT version, checkpoint_uri, sha256 FROM policy_versions WHERE run_id = :r ORDER BY 1",
                    r=run_id)
    assert [(v, u) for v, u, _ in versions] == [(v, f"s3://ckpt/run-{background}/v{v}") for v in range(4)]
    # pruned in storage as in the directory: the newest keep_policies (2)
    assert sorted(storage.versions_in(url, {"endpoint_url": s3_env.endpoint})) == [2, 3]
    assert sorted(p.name for p in (tmp_path / "learner-ckpt").glob("v*")) == ["v2", "v3"]
    assert any(f"published policy v3 at step 3 (s3://ckpt/run-{background}/v3)" in s for s in said)
    # a collector on another machine: a cache of its own, the row's URI and sha256
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "collector-home"))
    _, uri, sha = versions[-1]
    cache = storage.CheckpointCache(storage.cache_root("s3-run"), {"endpoint_url": s3_env.endpoint})
    got = cache.fetch(uri, 3, sha)
    assert got == tmp_path / "collector-home" / "cache" / "s3-run" / "v3"
    assert (got / "model.safetensors").read_bytes() == (tmp_path / "learner-ckpt" / "v3" / "model.safetensors").read_bytes()
    # reflexdb eval --checkpoint v3 / v0 (pruned) on that machine
    cfg = parse_config({"run": "s3-run", "learner": {"checkpoint_url": url,
                                                      "checkpoint_storage_options": {"endpoint_url": s3_env.endpoint}}})
    assert resolve_checkpoint(store, run_id, "v3", "base-model", cfg) == ("v3", got, 3)
    with pytest.raises(Exception, match=r"the weights of policy v0 \(s3://ckpt/run-.*/v0\) are gone"):
        resolve_checkpoint(store, run_id, "v0", "base-model", cfg)


def test_an_upload_is_retried_while_storage_does_not_answer(store, tmp_path, s3_env, fail_fast):
    """The server stopped (SIGSTOP) for a few seconds: the publish waits, retries, and records the
    version once the upload is whole; nothing is recorded meanwhile."""
    said = []
    ck, run_id = checkpointer(store, tmp_path, "s3://ckpt/outage/", said=said, options=fail_fast)
    ck.publish(0)
    s3_env.pause()
    threading.Timer(4.0, s3_env.resume).start()
    t0 = time.monotonic()
    ck.publish(1)
    assert time.monotonic() - t0 >= 3.5
    assert any("uploading v1 to s3://ckpt/outage/v1 failed" in s and "retrying in" in s for s in said), said
    assert rows(store, "SELECT version FROM policy_versions WHERE run_id = :r ORDER BY 1", r=run_id) == [(0,), (1,)]


def test_storage_down_past_upload_retry_s_stops_the_publish_with_the_url_and_cause(store, tmp_path, s3_env, fail_fast):
    ck, run_id = checkpointer(store, tmp_path, "s3://ckpt/down/", retry_s=2.0, options=fail_fast)
    ck.publish(0)
    s3_env.pause()
    try:
        with pytest.raises(PublishFailed, match=r"publishing policy v1 at step 1 failed: uploading v1 to "
                                                r"s3://ckpt/down/v1 failed for \d+ s \(learner.upload_retry_s 2\): .*"
                                                r"Nothing was recorded for v1") as err:
            ck.publish(1)
    finally:
        s3_env.resume()
    assert err.value.exit_code == 8 and "testing-secret" not in str(err.value)
    assert rows(store, "SELECT max(version) FROM policy_versions WHERE run_id = :r", r=run_id) == [(0,)]


@pytest.mark.model
def test_a_collector_loads_a_version_from_s3_and_samples_on_while_one_cannot_be_fetched(store, tmp_path, s3_env,
                                                                                      model_cache, monkeypatch):
    """A collector with its own home: v1 lies in S3 (the row names it), is fetched into its cache,
    verified and loaded; v2's row names files that are not there: the collector reports it, counts
    it, and goes on sampling with v1."""
    import re

    import torch
    from transformers import AutoModelForCausalLM

    from reflexdb.collector import fetch
    from reflexdb.collector.engines import make_engine
    from reflexdb.collector.runner import Collector
    from reflexdb.models import resolve_model

    monkeypatch.setattr(fetch, "BACKOFF_S", (0.1, 0.2))
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "collector-home"))
    src = resolve_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    model.save_pretrained(tmp_path / "v1")
    options = {"endpoint_url": s3_env.endpoint}
    manifest_sha = storage.upload(tmp_path / "v1", "s3://ckpt/collect/v1", options, limit_s=30)
    cfg = parse_config({"run": "collect-s3", "model": "tiny", "max_staleness": 100,
                        "collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}, "poll_interval_s": 0.1},
                        "learner": {"checkpoint_url": "s3://ckpt/collect/", "checkpoint_storage_options": options}})
    msgs = []
    c = Collector(cfg, store, make_engine("hf", model=src, device="cpu"), echo=msgs.append)
    c.setup()
    store.publish_policy(c.run_id, 1, "s3://ckpt/collect/v1", sha256=storage.weights_sha256(tmp_path / "v1"), step=1,
                         manifest_sha256=manifest_sha)
    deadline = time.monotonic() + 60
    while c.version < 1 and time.monotonic() < deadline:  # fetched in the background, loaded between groups
        c._maybe_reload()
        time.sleep(0.05)
    [loaded] = [m for m in msgs if m.startswith("loaded policy v1")]
    assert re.match(r"loaded policy v1 from s3://ckpt/collect/v1 \(manifest sha256 \w{12}… verified, and every file "
                    r"against it, cached in .*/collector-home/cache/collect-s3/v1\)", loaded), loaded
    store.publish_policy(c.run_id, 2, "s3://ckpt/collect/v2", sha256="0" * 64, step=2)  # nothing uploaded there
    t0 = time.monotonic()
    while c.stats.fetch_failures < 2 and time.monotonic() - t0 < 60:
        c.run(max_groups=c.stats.groups + 1)
    assert c.version == 1 and c.stats.fetch_failures >= 2 and c.stats.groups >= 2
    assert any(m.startswith("could not fetch policy v2 from s3://ckpt/collect/v2 (NotFound: nothing is published at")
               and "sampling with policy v1 meanwhile" in m for m in msgs), msgs
    assert rows(store, "SELECT DISTINCT policy_version FROM groups") == [(1,)]
    assert c.phase_seconds()["fetch_failures"] == c.stats.fetch_failures
    assert "checkpoint fetches failed" in c.stats.line(c.version)


def test_with_a_read_url_the_row_names_the_version_as_collectors_reach_it(store, tmp_path, s3_env):
    """learner.checkpoint_read_url: uploaded to s3://, recorded as https://... (a server in front of the bucket)."""
    run_id = store.create_run("read-url")
    ck = Checkpointer(store, run_id, "read-url", tmp_path / "ckpt", FakeEngine(), state_every=100, keep_states=1,
                      keep_policies=2, main=True, db=lambda fn: fn(), echo=lambda m: None,
                      url="s3://ckpt/read-url/", storage_options={"endpoint_url": s3_env.endpoint},
                      read_url="https://ckpt.example.com/read-url/")
    ck.prepare()
    ck.publish(0)
    assert rows(store, "SELECT checkpoint_uri FROM policy_versions WHERE run_id = :r", r=run_id) == [
        ("https://ckpt.example.com/read-url/v0",)]
    assert sorted(storage.versions_in("s3://ckpt/read-url/", {"endpoint_url": s3_env.endpoint})) == [0]


def _delete(name, db_url, home, *extra):
    import subprocess

    from tests.processes import REFLEXDB

    env = dict(os.environ, REFLEXDB_DATABASE_URL=db_url, REFLEXDB_HOME=str(home))
    return subprocess.run(REFLEXDB + ["runs", "delete", name, "--yes", *extra], env=env, capture_output=True,
                          text=True, timeout=120)


def test_deleting_a_run_deletes_its_versions_in_storage(store, db_url, tmp_path, s3_env):
    """`reflexdb runs delete` of a run that published to S3: the vK versions under its own prefix
    (<url>/<name>.r<id>/) go with its rows, then the prefix's marker, with this environment's
    credentials; other objects under the prefix stay."""
    from reflexdb.trainer.checkpointer import run_places

    run_id = store.create_run("gone", config={"run": "gone", "learner": {"checkpoint_url": "s3://ckpt/gone/"}})
    home = tmp_path / "home"
    directory, url, _ = run_places(run_id, "gone", home / "checkpoints", "s3://ckpt/gone/")
    assert url == f"s3://ckpt/gone/gone.r{run_id}" and directory == home / "checkpoints" / f"gone.r{run_id}"
    ck = Checkpointer(store, run_id, "gone", directory, FakeEngine(), state_every=100, keep_states=1, keep_policies=2,
                      main=True, db=lambda fn: fn(), echo=lambda m: None, url=url)
    ck.prepare()
    for step in range(3):
        ck.publish(step)
    fs, _ = storage.filesystem(url, None)
    fs.pipe_file(f"ckpt/gone/gone.r{run_id}/notes.txt", b"not a version")
    assert json.loads(fs.cat_file(f"ckpt/gone/gone.r{run_id}/reflexdb-run.json"))["run_id"] == run_id
    done = _delete("gone", db_url, home)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"deleted run 'gone': 0 trajectories, 0 steps, {directory}, its versions in "
                                   f"s3://ckpt/gone/gone.r{run_id} (2 there)")
    assert storage.versions_in(url, None) == {} and storage.read_owner(url, None) is None and not directory.exists()
    fs.invalidate_cache()
    assert fs.cat_file(f"ckpt/gone/gone.r{run_id}/notes.txt") == b"not a version"
    assert rows(store, "SELECT count(*) FROM runs WHERE name = 'gone'") == [(0,)]


def test_storage_that_does_not_answer_fails_the_deletion_with_its_cause(s3_env, fail_fast):
    from datetime import datetime, timezone

    from tests.s3server import free_port

    nowhere = {**fail_fast, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"}}
    owner = storage.Owner.of("x", 1, datetime.now(timezone.utc))
    with pytest.raises(storage.StorageError, match=r"could not delete the versions in s3://ckpt/x/: .*"):
        storage.remove_versions("s3://ckpt/x/", nowhere, owner=owner)


# ---------------------------------------------------------------- runs that share a URL or a directory (issue 60)


@pytest.mark.model
def test_two_learners_on_one_url_and_directory_keep_their_own_versions(store, db_url, tmp_path, s3_env,
                                                                      monkeypatch, model_cache):
    """Two runs whose configs name the same learner.checkpoint_url and checkpoint_dir: each learner
    publishes under its own <name>.r<id>, prunes only its own, and `runs delete` of one leaves every
    version (and learner state) of the other, which a collector still fetches and verifies. (A
    local checkpoint_url alone: the next test.)"""
    where = "s3"
    from reflexdb.trainer.learner import Learner
    from tests.store.test_learn import config_data

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    shared = tmp_path / "shared-ckpt"
    learner = {"checkpoint_dir": str(shared), "keep_policies": 2, "keep_states": 1}
    if where == "s3":
        learner.update(checkpoint_url="s3://ckpt/shared/", checkpoint_storage_options={"endpoint_url": s3_env.endpoint})
    learners = {}
    for run in ("twin-a", "twin-b"):
        lr = Learner(parse_config(dict(config_data(**learner), run=run, max_staleness=100)), store, echo=lambda m: None)
        lr.setup()  # publishes v0
        for step in (1, 2, 3):
            lr.checkpoints.publish(step, state=step == 3)
        lr.checkpoints.close()
        lr.tracker.close()
        learners[run] = lr
    a, b = learners["twin-a"], learners["twin-b"]
    options = {"endpoint_url": s3_env.endpoint}

    def published(lr):
        return rows(store, "SELECT version, checkpoint_uri, sha256 FROM policy_versions WHERE run_id = :r ORDER BY 1",
                    r=lr.run_id)

    for lr in (a, b):
        key = f"{lr.cfg.run}.r{lr.run_id}"
        assert lr.ckpt_dir == shared / key
        base = f"s3://ckpt/shared/{key}" if where == "s3" else f"file://{shared / key}"
        assert [u for _, u, _ in published(lr)] == [f"{base}/v{v}" for v in range(4)]
        assert sorted(p.name for p in lr.ckpt_dir.glob("v*")) == ["v2", "v3"]  # each pruned its own only
        if where == "s3":
            assert sorted(storage.versions_in(base, options)) == [2, 3]
    b_before = published(b)
    done = _delete("twin-a", db_url, tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert "not deleted" not in done.stdout, done.stdout
    assert not a.ckpt_dir.exists() and b.ckpt_dir.is_dir()
    assert sorted(p.name for p in b.ckpt_dir.glob("v*")) == ["v2", "v3"] and (b.ckpt_dir / "states" / "v3").is_dir()
    assert published(b) == b_before
    _, uri, sha = b_before[-1]
    if where == "s3":
        assert storage.versions_in(f"s3://ckpt/shared/twin-a.r{a.run_id}", options) == {}
        monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "collector-home"))
        got = storage.CheckpointCache(storage.cache_root("twin-b"), options).fetch(uri, 3, sha)
        assert storage.weights_sha256(got) == sha
    else:
        assert storage.weights_sha256(storage.local_path(uri)) == sha


def test_a_learner_is_refused_a_prefix_or_directory_another_run_owns(store, tmp_path, s3_env):
    """A second learner aimed at a prefix (or a local directory) that another run publishes to —
    through a copied config, or a run of another database with the same name and id — is refused
    before it writes or prunes anything there; the message names the run that owns it."""
    options = {"endpoint_url": s3_env.endpoint}
    a_id = store.create_run("owner-a")
    b_id = store.create_run("intruder-b")
    a = Checkpointer(store, a_id, "owner-a", tmp_path / "a", FakeEngine(), state_every=100, keep_states=1,
                     keep_policies=2, main=True, db=lambda fn: fn(), echo=lambda m: None, url="s3://ckpt/owned/",
                     storage_options=options)
    a.prepare()
    for step in range(3):
        a.publish(step)
    before = storage.versions_in("s3://ckpt/owned/", options)
    said = []
    b = Checkpointer(store, b_id, "intruder-b", tmp_path / "b", FakeEngine(), state_every=100, keep_states=1,
                     keep_policies=2, main=True, db=lambda fn: fn(), echo=said.append, url="s3://ckpt/owned/",
                     storage_options=options)
    b.prepare()
    with pytest.raises(PublishFailed, match=r"publishing policy v0 at step 0 failed: s3://ckpt/owned belongs to run "
                                            rf"'owner-a' \(id {a_id}, created .*\) \(reflexdb-run.json there\), not to "
                                            rf"run 'intruder-b' \(id {b_id}, .*refusing to publish there"):
        b.publish(0)
    assert rows(store, "SELECT count(*) FROM policy_versions WHERE run_id = :r", r=b_id) == [(0,)]
    assert storage.prune("s3://ckpt/owned/", options, 10, 1, echo=said.append, owner=b.owner) == []
    assert any("could not prune old versions in s3://ckpt/owned/ (PrefixOwned: " in m and "not pruning" in m
               for m in said), said
    assert storage.versions_in("s3://ckpt/owned/", options) == before  # nothing written over or pruned
    # the same for a local directory: refused before its temporary files are cleaned
    (tmp_path / "a" / "v9.tmp-123").mkdir()
    c = Checkpointer(store, b_id, "intruder-b", tmp_path / "a", FakeEngine(), state_every=100, keep_states=1,
                     keep_policies=2, main=True, db=lambda fn: fn(), echo=lambda m: None)
    with pytest.raises(PublishFailed, match=rf"learner.checkpoint_dir: {tmp_path / 'a'} belongs to run 'owner-a'"):
        c.prepare()
    assert (tmp_path / "a" / "v9.tmp-123").is_dir() and sorted(p.name for p in (tmp_path / "a").glob("v?")) == ["v1", "v2"]


def test_versions_recorded_before_runs_had_prefixes_are_pruned_and_deleted_only_while_still_theirs(
        store, db_url, tmp_path, s3_env):
    """Rows recorded before per-run prefixes name <url>/vK, which two runs may have shared: a run
    that resumes publishes under its own prefix from then on; its old versions are still fetched,
    and are pruned and deleted only while their weights are the ones its rows record (the other
    run's v1, uploaded over it, stays)."""
    from reflexdb.trainer.checkpointer import run_places

    options = {"endpoint_url": s3_env.endpoint}
    old = "s3://ckpt/old"
    cfg = {"learner": {"checkpoint_url": old + "/", "checkpoint_storage_options": options}}
    a_id, b_id = store.create_run("old-a", config=cfg), store.create_run("old-b", config=cfg)
    shas = {}
    for run, version, seed in ((a_id, 0, 1), (a_id, 1, 2), (b_id, 1, 3)):  # old-b's v1 written over old-a's
        d = tmp_path / f"w{seed}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(np.random.default_rng(seed).bytes(1000))
        storage.upload(d, f"{old}/v{version}", options, limit_s=30)
        shas[run, version] = storage.weights_sha256(d)
        store.publish_policy(run, version, f"{old}/v{version}", sha256=shas[run, version], step=version)
    cache = storage.CheckpointCache(tmp_path / "cache", options)
    assert storage.weights_sha256(cache.fetch(f"{old}/v0", 0, shas[a_id, 0])) == shas[a_id, 0]  # still fetched
    directory, url, _ = run_places(a_id, "old-a", tmp_path / "ckpt", old + "/")
    said = []
    a = Checkpointer(store, a_id, "old-a", directory, FakeEngine(), state_every=100, keep_states=1, keep_policies=2,
                     main=True, db=lambda fn: fn(), echo=said.append, url=url, storage_options=options)
    a.prepare()
    a.adopt(store.latest_policy(a_id))
    for step in (2, 3, 4):
        a.publish(step, state=step == 4)  # v2, v3, v4 under s3://ckpt/old/old-a.r<id>/; v0..v2 pruned
    assert sorted(storage.versions_in(url, options)) == [3, 4]
    assert sorted(storage.versions_in(old, options)) == [1]  # old-a's v0 pruned; v1 is old-b's now: kept
    assert storage.weights_sha256(cache.fetch(f"{old}/v1", 1, shas[b_id, 1])) == shas[b_id, 1]
    done = _delete("old-a", db_url, tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"deleted run 'old-a': 0 trajectories, 0 steps, {directory}, its versions in {url}, "
                                  "2 version(s) recorded before it had a place of its own (where their weights are "
                                  "still its own) (2 there)\n")
    assert (f"not deleted: v1 at {old}/v1: its weights are not the ones this run recorded (another run on the same "
            "place published over it?)") in done.stdout
    assert storage.versions_in(url, options) == {} and sorted(storage.versions_in(old, options)) == [1]


def test_a_planted_run_config_aims_runs_delete_at_nothing(store, db_url, tmp_path, s3_env):
    """A runs row whose config names someone else's directory and prefix (inserted by a login that
    could insert runs, before the collector role lost that right): `runs delete` deletes only what
    the run's own policy_versions rows recorded, here nothing."""
    victim = tmp_path / "victim"
    (victim / "v1").mkdir(parents=True)
    (victim / "v1" / "model.safetensors").write_bytes(b"precious")
    files = tmp_path / "weights"
    files.mkdir()
    (files / "model.safetensors").write_bytes(b"w" * 1000)
    for v in (1, 2):
        storage.upload(files, f"s3://ckpt/victim/v{v}", None, limit_s=30)
    store.create_run("planted", config={"run": "planted", "learner": {"checkpoint_dir": str(victim),
                                                                      "checkpoint_url": "s3://ckpt/victim/"}})
    done = _delete("planted", db_url, tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deleted run 'planted': 0 trajectories, 0 steps"
    assert (victim / "v1" / "model.safetensors").read_bytes() == b"precious"
    assert sorted(storage.versions_in("s3://ckpt/victim/", None)) == [1, 2]


def test_two_runs_publishing_to_one_local_directory_keep_their_own_versions(store, db_url, tmp_path):
    """learner.checkpoint_url (or checkpoint_dir) a local directory two runs share: each publishes
    under <dir>/<name>.r<id>/ (rows file://…), prunes only its own, and `runs delete` of one leaves
    the other's versions and learner states."""
    from reflexdb.trainer.checkpointer import run_places

    shared = tmp_path / "shared"
    cks = {}
    for run in ("local-a", "local-b"):
        run_id = store.create_run(run, config={"run": run, "learner": {"checkpoint_url": str(shared)}})
        directory, _, _ = run_places(run_id, run, shared)
        cks[run] = Checkpointer(store, run_id, run, directory, FakeEngine(), state_every=2, keep_states=1,
                                keep_policies=2, main=True, db=lambda fn: fn(), echo=lambda m: None)
        cks[run].prepare()
    for step in range(4):  # interleaved: a's v0, b's v0, a's v1, ...
        for ck in cks.values():
            ck.publish(step)
    a, b = cks["local-a"], cks["local-b"]
    for ck in (a, b):
        assert rows(store, "SELECT checkpoint_uri FROM policy_versions WHERE run_id = :r ORDER BY version",
                    r=ck.run_id) == [(f"file://{ck.dir}/v{v}",) for v in range(4)]
        assert sorted(p.name for p in ck.dir.glob("v*")) == ["v2", "v3"]
    b_files = sorted(str(p.relative_to(b.dir)) for p in b.dir.rglob("*"))
    done = _delete("local-a", db_url, tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"deleted run 'local-a': 0 trajectories, 0 steps, {a.dir}"
    assert not a.dir.exists() and sorted(str(p.relative_to(b.dir)) for p in b.dir.rglob("*")) == b_files
    assert "states/v2" in b_files and "reflexdb-run.json" in b_files


# ---------------------------------------------------------------------- new weights in seconds (issue 62)

def test_a_publish_records_its_manifest_and_a_copy_in_shared_memory_for_collectors_on_this_machine(
        store, tmp_path, monkeypatch):
    """Every version, local too, is recorded with the digest of its manifest.json; with shared
    memory the version is copied there before its row, which says where and on which machine; the
    newest two copies stay, and the learner removes them when it stops."""
    from reflexdb import shm

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    run_id = store.create_run("shm-run")
    said = []
    shared = shm.SharedCopies(tmp_path / "shm", storage.run_key(run_id, "shm-run"), echo=said.append)
    ck = Checkpointer(store, run_id, "shm-run", tmp_path / "learner-ckpt", FakeEngine(), state_every=100,
                      keep_states=1, keep_policies=2, main=True, db=lambda fn: fn(), echo=said.append, shared=shared)
    ck.prepare()
    for step in range(4):
        ck.publish(step)
    got = rows(store, "SELECT version, checkpoint_uri, sha256, manifest_sha256, meta FROM policy_versions "
                      "WHERE run_id = :r ORDER BY 1", r=run_id)
    for version, uri, sha, man_sha, meta in got:
        assert uri == f"file://{ck.dir}/v{version}" and man_sha is not None
        assert meta[shm.META_KEY] == {"path": str(shared.directory / f"v{version}"), **shm.identity()}
    assert sorted(p.name for p in shared.directory.glob("v*")) == ["v2", "v3"]
    _, _, sha, man_sha, meta = got[-1]
    copy = shm.locate(meta)
    assert copy == shared.directory / "v3" and storage.verify_version(copy, sha, man_sha)
    assert storage.verify_version(ck.dir / "v3", sha, man_sha)
    assert any("published policy v3 at step 3" in s and "in shared memory" in s for s in said)
    ck.close()
    assert not shared.directory.exists() and shm.locate(meta) is None
    # `reflexdb eval --checkpoint v3` reads the version in place: checked as a collector checks it
    assert resolve_checkpoint(store, run_id, "v3", "base-model") == ("v3", ck.dir / "v3", 3)
    (ck.dir / "v3" / "model.safetensors").write_bytes(b"torn")
    with pytest.raises(storage.TornVersion, match=r"^not evaluating policy v3: .*/v3/model.safetensors: holds 4 bytes"):
        resolve_checkpoint(store, run_id, "v3", "base-model")


def test_a_version_of_many_files_is_fetched_from_s3_with_reads_in_flight_at_once(tmp_path, s3_env, monkeypatch):
    """collector.checkpoint_fetch_concurrency (issue 62): the shards of a version are read from the
    S3 server several at once, and the version is checked as before (manifest digest, sizes, every
    file's sha256, the weights' sha256)."""
    import s3fs

    src = tmp_path / "learner" / "v1"
    src.mkdir(parents=True)
    for i in range(8):
        (src / f"model-{i + 1:05d}-of-00008.safetensors").write_bytes(np.random.default_rng(i).bytes(200_000))
    (src / "config.json").write_text("{}")
    sha, man_sha = storage.write_manifest(src)
    uri = "s3://ckpt/parallel/v1"
    assert storage.upload(src, uri, None, limit_s=30) == man_sha
    real, lock, now, most = s3fs.S3FileSystem.cat_file, threading.Lock(), [0], [0]

    def counted(self, path, *a, **kw):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            time.sleep(0.05)  # a read takes a moment: the others start meanwhile
            return real(self, path, *a, **kw)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(s3fs.S3FileSystem, "cat_file", counted)
    s3fs.S3FileSystem.clear_instance_cache()  # one made before mirrors the unpatched method on itself
    cache = storage.CheckpointCache(tmp_path / "cache", concurrency=4)
    got = cache.fetch(uri, 1, sha, man_sha)
    assert most[0] == 4
    assert storage.weights_sha256(got) == sha and all(
        (got / p.name).read_bytes() == p.read_bytes() for p in src.iterdir() if p.name != "manifest.json")
