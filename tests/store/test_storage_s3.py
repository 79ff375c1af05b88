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


def test_deleting_a_run_deletes_its_versions_in_storage(store, db_url, tmp_path, s3_env):
    """`reflexdb runs delete` of a run that published to S3: its vK prefixes go with its rows,
    with this environment's credentials; other objects under the prefix stay."""
    import subprocess

    from tests.processes import REFLEXDB

    files = tmp_path / "weights"
    files.mkdir()
    (files / "model.safetensors").write_bytes(b"w" * 1000)
    for v in (1, 2):
        storage.upload(files, f"s3://ckpt/gone/v{v}", None, limit_s=30)
    fs, _ = storage.filesystem("s3://ckpt/gone/", None)
    fs.pipe_file("ckpt/gone/notes.txt", b"not a version")
    store.create_run("gone", config={"run": "gone", "learner": {"checkpoint_url": "s3://ckpt/gone/"}})
    env = dict(os.environ, REFLEXDB_DATABASE_URL=db_url, REFLEXDB_HOME=str(tmp_path / "home"))
    done = subprocess.run(REFLEXDB + ["runs", "delete", "gone", "--yes"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deleted run 'gone': 0 trajectories, 0 steps, its versions in s3://ckpt/gone/ (2 there)"
    assert storage.versions_in("s3://ckpt/gone/", None) == {}
    fs.invalidate_cache()
    assert fs.cat_file("ckpt/gone/notes.txt") == b"not a version"
    assert rows(store, "SELECT count(*) FROM runs WHERE name = 'gone'") == [(0,)]


def test_storage_that_does_not_answer_fails_the_deletion_with_its_cause(s3_env, fail_fast):
    from tests.s3server import free_port

    nowhere = {**fail_fast, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"}}
    with pytest.raises(storage.StorageError, match=r"could not delete the versions in s3://ckpt/x/: .*"):
        storage.remove_versions("s3://ckpt/x/", nowhere)
