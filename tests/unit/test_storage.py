"""Published weights in object storage (reflexdb/storage.py, collector/fetch.py), on fsspec's
in-memory filesystem: URLs and masking, credentials refused in the config, upload then fetch,
a broken download resumed with ranged reads, sha256 mismatches, pruning, retries."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest

from reflexdb import storage
from reflexdb.config import ConfigError, parse_config
from reflexdb.errors import NotFound
from reflexdb.records import PolicyVersion

SECRET = "wJalrXUtnFEMI-s3cret"


def version_dir(tmp_path, name="v1", size=200_000, seed=0):
    """A published version as export_hf writes one: weights, config, tokenizer files."""
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(np.random.default_rng(seed).bytes(size))
    (d / "config.json").write_text(json.dumps({"seed": seed}))
    (d / "tokenizer.json").write_text("{}" * 100)
    return d


@pytest.fixture
def base():
    """A fresh prefix of the in-memory filesystem (shared by the process: one per test)."""
    url = f"memory://bucket-{uuid.uuid4().hex[:8]}/run"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url.removeprefix("memory://")):
        fs.rm(url.removeprefix("memory://"), recursive=True)


# ---------------------------------------------------------------------- URLs, masking, config

@pytest.mark.parametrize("url", [
    f"https://alice:{SECRET}@ckpt.example.com/run/v3",
    f"https://bucket.s3.amazonaws.com/run/v3/model.safetensors?X-Amz-Credential=AKIA%2F{SECRET}&X-Amz-Signature={SECRET}&X-Amz-Expires=3600",
    f"https://acct.blob.core.windows.net/c/run?sv=2024&sig={SECRET}",
    f"s3://bucket/run/?token={SECRET}",
])
def test_mask_hides_credentials_in_storage_urls(url):
    masked = storage.mask(url)
    assert SECRET not in masked and "***" in masked
    assert "X-Amz-Expires=3600" in storage.mask(url) or "Expires" not in url  # the rest stays


def test_plain_urls_are_unchanged_by_mask():
    for url in ("s3://bucket/run/v3", "gs://b/p", "/tmp/x", "file:///tmp/x", "memory://b/r"):
        assert storage.mask(url) == url


def test_remote_and_local():
    assert storage.is_remote("s3://b/run/v1") and storage.is_remote("gs://b/x") and storage.is_remote("memory://b")
    assert not storage.is_remote("file:///tmp/ckpt/v1") and not storage.is_remote("/tmp/ckpt")
    assert storage.version_uri("s3://b/run/", 3) == storage.version_uri("s3://b/run", 3) == "s3://b/run/v3"
    assert storage.local_dir("file:///tmp/c") == storage.local_dir("/tmp/c") and storage.local_dir("s3://b") is None


@pytest.mark.parametrize("url,problem", [
    (f"https://alice:{SECRET}@host/run", "credentials in the URL are refused"),
    (f"s3://bucket/run?X-Amz-Signature={SECRET}", "credentials in the URL are refused"),
    ("https://host/run/", "read-only"),
    ("nosuchscheme://b/run", "fsspec knows no filesystem"),
])
def test_a_checkpoint_url_with_credentials_or_unwritable_is_refused(url, problem):
    with pytest.raises(ConfigError, match=problem) as err:
        parse_config({"run": "r", "learner": {"checkpoint_url": url}})
    assert SECRET not in str(err.value)


@pytest.mark.parametrize("options", [
    {"key": SECRET}, {"secret": SECRET}, {"token": SECRET}, {"aws_secret_access_key": SECRET},
    {"client_kwargs": {"aws_access_key_id": "AKIA", "region_name": "eu-west-1"}},
    {"storage_options": {"password": SECRET}}, {"session_token": SECRET},
])
def test_storage_options_that_look_like_credentials_are_refused(options):
    with pytest.raises(ConfigError, match="looks like a credential") as err:
        parse_config({"run": "r", "learner": {"checkpoint_url": "s3://b/run/", "checkpoint_storage_options": options}})
    assert SECRET not in str(err.value)


def test_non_secret_storage_options_are_accepted():
    options = {"endpoint_url": "http://127.0.0.1:9000", "client_kwargs": {"region_name": "eu-west-1"},
               "profile": "training", "config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 2}}}
    cfg = parse_config({"run": "r", "learner": {"checkpoint_url": "s3://b/run/", "checkpoint_storage_options": options}})
    assert cfg.learner.checkpoint_storage_options == options and cfg.masked()["learner"]["checkpoint_url"] == "s3://b/run/"


def test_a_local_checkpoint_url_is_the_checkpoint_dir(tmp_path):
    cfg = parse_config({"run": "r", "learner": {"checkpoint_url": f"file://{tmp_path}"}})
    assert storage.local_dir(cfg.learner.checkpoint_url) == tmp_path and storage.remote_url(cfg.learner.checkpoint_url) is None
    with pytest.raises(ConfigError, match="give one of them"):
        parse_config({"run": "r", "learner": {"checkpoint_url": str(tmp_path / "a"), "checkpoint_dir": str(tmp_path / "b")}})


# ---------------------------------------------------------------------- upload and fetch

def test_upload_then_fetch_gives_the_same_files_verified(tmp_path, base):
    src = version_dir(tmp_path / "learner")
    sha = storage.weights_sha256(src)
    uri = storage.version_uri(base, 1)
    storage.upload(src, uri, None, limit_s=5)
    fs, root = storage.filesystem(uri)
    man = json.loads(fs.cat_file(f"{root}/manifest.json"))
    assert man["weights_sha256"] == sha and {f["name"] for f in man["files"]} == {
        "model.safetensors", "config.json", "tokenizer.json"}
    cache = storage.CheckpointCache(tmp_path / "cache", keep=2)
    got = cache.fetch(uri, 1, sha)
    assert got == tmp_path / "cache" / "v1"
    for f in src.iterdir():
        assert (got / f.name).read_bytes() == f.read_bytes()
    assert storage.weights_sha256(got) == sha and not list(got.glob("*.part"))
    assert not (tmp_path / "cache" / "v1.partial").exists()
    # found in the cache the next time: nothing is read from storage
    fs.rm(root, recursive=True)
    assert cache.fetch(uri, 1, sha) == got


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_broken_download_resumes_from_its_part_file_with_ranged_reads(tmp_path, base, monkeypatch, concurrency):
    """One read after another, or several in flight (issue 62): the ranges are written in order, so
    the .part file is what was downloaded without a gap, and the next try starts where it ends."""
    src = version_dir(tmp_path / "learner", size=3_000_000)
    sha = storage.weights_sha256(src)
    uri = storage.version_uri(base, 2)
    storage.upload(src, uri, None, limit_s=5)
    monkeypatch.setattr(storage, "CHUNK", 1_000_000)
    fs, _ = storage.filesystem(uri)
    reads: list[tuple[str, int, int]] = []
    real = type(fs).cat_file
    drops = [1]

    def broken(self, path, start=None, end=None, **kw):
        if path.endswith("model.safetensors"):
            reads.append((path, start, end))
            if start == 1_000_000 and drops[0]:
                drops[0] = 0
                raise ConnectionResetError("the connection dropped")
        return real(self, path, start=start, end=end, **kw)

    monkeypatch.setattr(type(fs), "cat_file", broken)
    cache = storage.CheckpointCache(tmp_path / "cache", concurrency=concurrency)
    with pytest.raises(ConnectionResetError):
        cache.fetch(uri, 2, sha)
    part = tmp_path / "cache" / "v2.partial" / "model.safetensors.part"
    assert part.stat().st_size == 1_000_000  # the first range; the second broke off (a third read meanwhile: dropped)
    reads.clear()
    got = cache.fetch(uri, 2, sha)
    # the next try asked only for what was missing, from where the part file ended
    assert sorted((s, e) for _, s, e in reads) == [(1_000_000, 2_000_000), (2_000_000, 3_000_000)]
    assert storage.weights_sha256(got) == sha and (got / "model.safetensors").read_bytes() == \
        (src / "model.safetensors").read_bytes()


def test_a_file_that_differs_from_the_manifest_is_refused_and_fetched_again(tmp_path, base):
    src = version_dir(tmp_path / "learner")
    sha = storage.weights_sha256(src)
    uri = storage.version_uri(base, 1)
    storage.upload(src, uri, None, limit_s=5)
    fs, root = storage.filesystem(uri)
    good = fs.cat_file(f"{root}/tokenizer.json")
    fs.pipe_file(f"{root}/tokenizer.json", b"[" + good[1:])  # same size, other bytes
    cache = storage.CheckpointCache(tmp_path / "cache")
    with pytest.raises(storage.FetchFailed, match=r"tokenizer.json: sha256 .* is not the manifest's"):
        cache.fetch(uri, 1, sha)
    assert not (tmp_path / "cache" / "v1").exists()
    assert not (tmp_path / "cache" / "v1.partial" / "tokenizer.json").exists()  # removed: fetched again
    fs.pipe_file(f"{root}/tokenizer.json", good)
    assert storage.weights_sha256(cache.fetch(uri, 1, sha)) == sha


def test_weights_that_are_not_the_recorded_version_are_refused(tmp_path, base):
    src = version_dir(tmp_path / "learner")
    uri = storage.version_uri(base, 1)
    storage.upload(src, uri, None, limit_s=5)  # a consistent manifest, but not what the row recorded
    recorded = hashlib.sha256(b"the version the learner recorded").hexdigest()
    cache = storage.CheckpointCache(tmp_path / "cache")
    with pytest.raises(storage.FetchFailed, match=r"not the recorded .*policy_versions.sha256"):
        cache.fetch(uri, 1, recorded)
    assert not (tmp_path / "cache" / "v1").exists()
    assert not list((tmp_path / "cache" / "v1.partial").glob("*.safetensors"))


def test_a_version_that_is_not_there_is_not_found_and_an_unfinished_one_fails(tmp_path, base):
    cache = storage.CheckpointCache(tmp_path / "cache")
    with pytest.raises(NotFound, match="nothing is published at"):
        cache.fetch(storage.version_uri(base, 9), 9, None)
    fs, root = storage.filesystem(base)
    fs.pipe_file(f"{root}/v8/model.safetensors", b"x")  # its upload never reached the manifest
    with pytest.raises(storage.FetchFailed, match="has no manifest.json"):
        cache.fetch(storage.version_uri(base, 8), 8, None)


def test_the_cache_keeps_the_newest_versions(tmp_path, base):
    cache = storage.CheckpointCache(tmp_path / "cache", keep=2)
    for v in range(1, 5):
        src = version_dir(tmp_path / "learner", f"v{v}", size=1000, seed=v)
        storage.upload(src, storage.version_uri(base, v), None, limit_s=5)
        cache.fetch(storage.version_uri(base, v), v, storage.weights_sha256(src))
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")) == ["v3", "v4"]


def test_a_cached_version_of_another_url_is_fetched_anew(tmp_path, base):
    """A run deleted and made again under the same name: its v1 is another version."""
    cache = storage.CheckpointCache(tmp_path / "cache")
    a = version_dir(tmp_path / "a", seed=1)
    b = version_dir(tmp_path / "b", seed=2)
    storage.upload(a, storage.version_uri(base, 1), None, limit_s=5)
    storage.upload(b, storage.version_uri(base + "-again", 1), None, limit_s=5)
    cache.fetch(storage.version_uri(base, 1), 1, storage.weights_sha256(a))
    got = cache.fetch(storage.version_uri(base + "-again", 1), 1, storage.weights_sha256(b))
    assert storage.weights_sha256(got) == storage.weights_sha256(b)


def test_storage_pruning_keeps_the_newest(tmp_path, base):
    for v in range(5):
        storage.upload(version_dir(tmp_path / "l", f"v{v}", size=100), storage.version_uri(base, v), None, limit_s=5)
    assert storage.prune(base, None, newest=4, keep=2) == [0, 1, 2]
    assert sorted(storage.versions_in(base, None)) == [3, 4]


def test_upload_retries_then_names_the_url_and_cause(tmp_path, base, monkeypatch):
    src = version_dir(tmp_path / "learner")
    fs, _ = storage.filesystem(base)
    real = type(fs).put_file
    failures = [2]

    def flaky(self, lpath, rpath, **kw):
        if failures[0]:
            failures[0] -= 1
            raise ConnectionError("storage went away")
        return real(self, lpath, rpath, **kw)

    monkeypatch.setattr(type(fs), "put_file", flaky)
    said = []
    storage.upload(src, storage.version_uri(base, 1), None, limit_s=30, echo=said.append)
    assert len(said) == 2 and all("storage went away" in s and "retrying in" in s for s in said)
    assert sorted(storage.versions_in(base, None)) == [1]
    failures[0] = 10**6
    t0 = time.monotonic()
    with pytest.raises(storage.StorageError, match=r"uploading v1 to memory://.*/v2 failed for \d+ s \(learner.upload_retry_s 1\): .*storage went away"):
        storage.upload(src, storage.version_uri(base, 2), None, limit_s=1, echo=said.append)
    assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------------- the collector's fetcher

def test_the_fetcher_reports_a_failure_and_retries_after_a_backoff(tmp_path, base, monkeypatch):
    from reflexdb.collector import fetch

    monkeypatch.setattr(fetch, "BACKOFF_S", (0.2, 1.0))
    src = version_dir(tmp_path / "learner")
    sha = storage.weights_sha256(src)
    uri = storage.version_uri(base, 3)
    policy = PolicyVersion(1, 3, uri, sha, 3, {}, None)
    said = []
    fetcher = fetch.Fetcher(storage.CheckpointCache(tmp_path / "cache"), said.append)
    assert fetcher.ready(policy, 2, wait=True) is None  # not uploaded yet
    assert fetcher.failures == 1 and "could not fetch policy v3 from memory://" in said[0]
    assert "sampling with policy v2 meanwhile, retrying in 0 s (1 failed fetch(es) so far)" in said[0]
    storage.upload(src, uri, None, limit_s=5)
    assert fetcher.ready(policy, 2, wait=True) is None  # within the backoff: not tried
    time.sleep(0.25)
    fetcher.ready(policy, 2)
    deadline = time.monotonic() + 10
    while (path := fetcher.ready(policy, 2)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path is not None and storage.weights_sha256(path) == sha and fetcher.failures == 1


# ---------------------------------------------------------------------- reading over HTTP(S)

class _RangeHandler:
    """A static file server that honours ``Range: bytes=a-b`` (an HTTP server or CDN in front of a bucket)."""

    @staticmethod
    def make(directory):
        import http.server

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(directory), **kw)

            def log_message(self, *args):
                pass

            def send_head(self):
                rng = self.headers.get("Range")
                path = self.translate_path(self.path)
                if not rng or not os.path.isfile(path):
                    return super().send_head()
                data = open(path, "rb").read()
                a, b = rng.removeprefix("bytes=").split("-")
                a, b = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {a}-{b}/{len(data)}")
                self.send_header("Content-Length", str(b - a + 1))
                self.end_headers()
                return io.BytesIO(data[a:b + 1])

        return Handler


@pytest.fixture
def http_dir(tmp_path):
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler.make(served))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_version_is_fetched_over_http_by_its_manifest_with_ranged_reads(tmp_path, http_dir, monkeypatch):
    """learner.checkpoint_read_url: https://...: the same files, served by a web server (which
    cannot list a directory): the manifest names them, ranged reads fetch them, the sha256 checks them."""
    served, base = http_dir
    src = version_dir(tmp_path / "learner", size=2_500_000)
    sha = storage.weights_sha256(src)
    storage.upload(src, f"file://{served}/run/v4", None, limit_s=5)  # what the bucket behind the server holds
    monkeypatch.setattr(storage, "CHUNK", 1_000_000)
    got = storage.CheckpointCache(tmp_path / "cache").fetch(f"{base}/run/v4", 4, sha)
    assert storage.weights_sha256(got) == sha and (got / "config.json").read_bytes() == (src / "config.json").read_bytes()


def test_the_read_url_is_checked_and_needs_an_upload_url():
    cfg = parse_config({"run": "r", "learner": {"checkpoint_url": "s3://b/run/",
                                                "checkpoint_read_url": "https://ckpt.example.com/run/"}})
    assert cfg.learner.checkpoint_read_url == "https://ckpt.example.com/run/"
    with pytest.raises(ConfigError, match="checkpoint_read_url needs learner.checkpoint_url in object storage"):
        parse_config({"run": "r", "learner": {"checkpoint_read_url": "https://ckpt.example.com/run/"}})
    with pytest.raises(ConfigError, match="credentials in the URL are refused") as err:
        parse_config({"run": "r", "learner": {"checkpoint_url": "s3://b/run/",
                                              "checkpoint_read_url": f"https://ckpt.example.com/run/?sig={SECRET}"}})
    assert SECRET not in str(err.value)
    # the storage options are checkpoint_url's: a version read over https gets none
    assert storage.options_for("https://ckpt.example.com/run/v1", "s3://b/run/", {"endpoint_url": "x"}) == {}
    assert storage.options_for("s3://b/run/v1", "s3://b/run/", {"endpoint_url": "x"}) == {"endpoint_url": "x"}


def test_s3fs_own_tries_are_capped_so_an_outage_fails_calls_within_seconds():
    """s3fs nests its own tries in ranged reads (5 x 5): a 30 s outage then hung a marker or manifest
    read for ~2 minutes and nothing was reported (the storage drill's outage went unfelt); reflexdb's
    own retries, with backoff and a time budget, are what ride an outage out."""
    pytest.importorskip("s3fs")
    fs, _ = storage.filesystem("s3://bucket/run", {"endpoint_url": "http://127.0.0.1:9"})
    assert fs.retries == storage.S3_TRIES == 2


# ---------------------------------------------------------------------- a version read in place (issue 62)

def sharded_version(tmp_path, name="v1", shards=3, size=50_000, seed=0):
    """A sharded version as export_hf writes one: shards, their index, config, and manifest.json."""
    d = tmp_path / name
    d.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for n in names:
        (d / n).write_bytes(rng.bytes(size))
    (d / storage.INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}}))
    (d / "config.json").write_text(json.dumps({"seed": seed}))
    sha, man_sha = storage.write_manifest(d)
    return d, sha, man_sha


def test_the_manifest_lists_every_file_but_itself_and_upload_sends_the_one_written(tmp_path, base):
    d, sha, man_sha = sharded_version(tmp_path)
    man = json.loads((d / "manifest.json").read_bytes())
    assert [f["name"] for f in man["files"]] == sorted(p.name for p in d.iterdir() if p.name != "manifest.json")
    assert man["weights_sha256"] == sha == storage.weights_sha256(d)  # the shards in name order: one definition
    assert storage.manifest_digest(d) == (sha, man_sha)
    assert storage.write_manifest(d) == (sha, man_sha)  # written again over it: the same bytes
    assert storage.upload(d, storage.version_uri(base, 1), None, limit_s=5) == man_sha
    assert storage.verify_version(d, sha, man_sha).startswith(f"manifest sha256 {man_sha[:12]}… verified")


def _tear(d: Path, how: str) -> str:
    """Tear version ``d`` as a crash, a full disk or a bad sector would; the file it names."""
    shard = d / "model-00002-of-00003.safetensors"
    if how == "deleted":
        shard.unlink()
    elif how == "truncated":
        shard.write_bytes(shard.read_bytes()[:1000])
    elif how == "corrupted":
        data = bytearray(shard.read_bytes())
        data[123] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif how == "stray":
        shutil.copyfile(shard, d / "model-00004-of-00004.safetensors")
        return "model-00004-of-00004.safetensors"
    elif how == "manifest":
        (d / "manifest.json").unlink()
        return "manifest.json"
    return shard.name


@pytest.mark.parametrize("how,why", [
    ("deleted", r"missing \(listed in manifest.json, 50,000 bytes\)"),
    ("truncated", r"holds 1,000 bytes, manifest.json lists 50,000 \(truncated, or written over\)"),
    ("corrupted", r"sha256 \w+… is not the manifest's \w+…"),
    ("stray", "a shard manifest.json does not list"),
    ("manifest", r"missing \(the version's files are incomplete\)"),
])
def test_a_torn_version_read_in_place_is_refused_naming_the_file(tmp_path, how, why):
    d, sha, man_sha = sharded_version(tmp_path)
    name = _tear(d, how)
    with pytest.raises(storage.TornVersion, match=rf"^{re.escape(str(d))}/{re.escape(name)}: {why}"):
        storage.verify_version(d, sha, man_sha)


@pytest.mark.parametrize("how", ["deleted", "truncated", "corrupted"])
def test_a_version_without_a_manifest_digest_is_checked_against_the_weights_sha256(tmp_path, how):
    """Rows recorded before issue 62 name a local version by its weights' sha256 alone."""
    d, sha, _ = sharded_version(tmp_path)
    assert storage.verify_version(d, sha, None) == f"weights' sha256 {sha[:12]}… verified"
    name = _tear(d, how)
    match = f"{name}: missing" if how == "deleted" else r"the weights' sha256 \w+… is not the recorded"
    with pytest.raises(storage.TornVersion, match=match):
        storage.verify_version(d, sha, None)


def test_a_manifest_other_than_the_recorded_one_is_refused_before_any_shard_is_read(tmp_path, monkeypatch):
    d, sha, man_sha = sharded_version(tmp_path)
    man = json.loads((d / "manifest.json").read_bytes())
    man["files"][0]["size"] += 1
    (d / "manifest.json").write_text(json.dumps(man))
    hashed = []
    monkeypatch.setattr(storage, "_file_sha256", lambda p: hashed.append(p) or "0" * 64)
    with pytest.raises(storage.TornVersion, match=r"manifest.json: sha256 \w+… is not the recorded .*manifest_sha256"):
        storage.verify_version(d, sha, man_sha)
    assert hashed == []


def test_the_fetch_keeps_reads_in_flight_across_the_files_of_a_version(tmp_path, base, monkeypatch):
    """collector.checkpoint_fetch_concurrency: a version of several shards, each smaller than a
    range, is fetched with several reads at once (the storage library's own calls overlap)."""
    import threading

    d, sha, man_sha = sharded_version(tmp_path / "learner", shards=6)
    uri = storage.version_uri(base, 3)
    storage.upload(d, uri, None, limit_s=5)
    fs, _ = storage.filesystem(uri)
    real, lock, now, most = type(fs).cat_file, threading.Lock(), [0], [0]

    def slow(self, path, start=None, end=None, **kw):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05)
        try:
            return real(self, path, start=start, end=end, **kw)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(type(fs), "cat_file", slow)
    got = storage.CheckpointCache(tmp_path / "cache", concurrency=4).fetch(uri, 3, sha, man_sha)
    assert most[0] == 4 and storage.weights_sha256(got) == sha
