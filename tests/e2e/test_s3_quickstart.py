"""The quickstart's shape with ``learner.checkpoint_url: s3://...``, through a real S3 server
(moto's, tests/s3server.py), and a collector that cannot read the learner's disk: the learner and
the collector each have their own ``REFLEXDB_HOME``, and the collector is given only the database
URL and the storage's credentials and endpoint in its environment (docs/operations.md, "A remote
collector in two commands"). Checked: every version the collector loaded came from s3:// and was
verified against the recorded digest of its manifest (and so every file); its cache holds the newest few, as the rows say; the
learner's checkpoint directory never appears in its output; ``reflexdb eval`` on the collector's
side fetches the version it evaluates the same way.

(Running as root, making the learner's directory unreadable would prove nothing: root reads it
anyway. The separate homes are what keeps the collector off it: nothing tells it the path but the
rows, and they name s3:// only.)
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

from tests.processes import REFLEXDB, child_env, rows
from tests.s3server import S3Server
from tests.store.test_learn import config_data, write_config


@pytest.fixture
def s3(tmp_path):
    server = S3Server(tmp_path / "moto.log")
    server.make_bucket("quickstart")
    yield server
    server.stop()


def test_a_collector_with_no_access_to_the_learners_disk_trains_through_s3(store, db_url, tmp_path, model_cache, s3):
    data = config_data()
    # no copy in shared memory: the collector plays one on another machine (it would load from there)
    data["learner"].update(checkpoint_url="s3://quickstart/run/", keep_policies=3, shared_memory_publish="off")
    data["collector"]["checkpoint_cache_versions"] = 2
    data["tasks"] = {"eval_size": 2}
    cfg = write_config(tmp_path, data)
    learner_env = dict(child_env(db_url, tmp_path / "learner", model_cache), **s3.env())
    collector_env = dict(child_env(db_url, tmp_path / "collector", model_cache), **s3.env())
    learner_home, collector_home = learner_env["REFLEXDB_HOME"], collector_env["REFLEXDB_HOME"]
    collector = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg)], env=collector_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        learner = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "3"], env=learner_env,
                                 capture_output=True, text=True, timeout=600)
        assert learner.returncode == 0, learner.stderr[-3000:]
        deadline = time.monotonic() + 120
        while rows(store, "SELECT max(policy_version) FROM collectors") < [(2,)] and time.monotonic() < deadline:
            time.sleep(0.2)
        collector.send_signal(signal.SIGTERM)
        _, cerr = collector.communicate(timeout=120)
    finally:
        collector.kill()
    assert collector.returncode == 0, cerr[-3000:]
    # Every version is recorded with its S3 URI under the run's own prefix, uploaded before its row.
    [(run_id,)] = rows(store, "SELECT id FROM runs WHERE name = 'learn-test'")
    base = f"s3://quickstart/run/learn-test.r{run_id}"
    versions = rows(store, "SELECT version, checkpoint_uri, sha256, manifest_sha256 FROM policy_versions ORDER BY 1")
    assert [(v, u) for v, u, _, _ in versions] == [(v, f"{base}/v{v}") for v in range(4)]
    sha = {v: s for v, _, s, _ in versions}
    manifest = {v: m for v, _, _, m in versions}  # the digest of each uploaded manifest.json (0029)
    assert all(m is not None for m in manifest.values())
    assert f"published policy v3 at step 3 ({base}/v3)" in learner.stderr
    # The collector loaded at least two new versions, each from S3, each verified against its row.
    loaded = re.findall(r"loaded policy v(\d+) from (\S+) (.*) in [\d.]+s", cerr)
    assert len(loaded) >= 2, cerr[-3000:]
    for v, uri, how in loaded:
        v = int(v)
        assert uri == f"{base}/v{v}", uri
        assert how == (f"(manifest sha256 {manifest[v][:12]}… verified, and every file against it, cached in "
                       f"{collector_home}/cache/learn-test/v{v})"), how
    assert learner_home not in cerr and "file://" not in cerr
    # Its cache: the newest checkpoint_cache_versions (2) whole versions, each what its row recorded.
    cache = tmp_path / "collector" / "home" / "cache" / "learn-test"
    kept = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    newest = max(int(v) for v, _, _ in loaded)
    assert kept[-1] == f"v{newest}" and len(kept) <= 2 and not any(k.endswith(".partial") for k in kept), kept
    for name in kept:
        v = int(name[1:])
        assert json.loads((cache / name / ".source").read_text()) == {
            "uri": f"{base}/v{v}", "sha256": sha[v], "manifest_sha256": manifest[v]}
        assert not list((cache / name).glob("*.part"))
    # Samples came from the versions it loaded; everything consumed traces back, staleness within eta.
    assert rows(store, "SELECT count(DISTINCT policy_version) >= 2 FROM groups") == [(True,)]
    traced = rows(store, """
        SELECT count(*), count(g.id), count(s.id), bool_and(s.policy_version - g.policy_version <= 1)
        FROM consumption c JOIN trajectories t ON t.id = c.trajectory_id JOIN groups g ON g.id = t.group_id
        JOIN learner_steps s ON s.id = c.step_id""")
    assert traced == [(24, 24, 24, True)]
    # The learner pruned storage as keep_policies says: v1..v3 left, beside the run's marker.
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3.endpoint, key="testing", secret="testing-secret")
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(base.removeprefix("s3://"))) == [
        "reflexdb-run.json", "v1", "v2", "v3"]
    # reflexdb eval on the collector's machine: the version comes from S3 the same way.
    ev = subprocess.run(REFLEXDB + ["eval", "-c", str(cfg), "--checkpoint", "v3", "--max-tasks", "1"],
                        env=dict(collector_env, REFLEXDB_HOME=collector_home), capture_output=True, text=True,
                        timeout=300)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert (cache / "v3" / "model.safetensors").exists() and learner_home not in ev.stdout + ev.stderr
