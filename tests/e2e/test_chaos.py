"""The failure drill's short mode (benchmarks/chaos.py --short), run on every change.

Collectors and the learner killed at chosen phases, a writer stalled mid-transaction, the learner
killed while it holds torch's build lock, a database outage; then every invariant of
docs/reliability.md is checked with SQL and the files. The 10-minute drill's figures are in
docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]



def test_the_short_failure_drill_finds_no_violation(tmp_path, model_cache):
    env = {k: v for k, v in os.environ.items()
           if k not in ("REFLEXDB_DATABASE_URL", "MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                        "MLFLOW_TRACKING_URI")}
    env.update(REFLEXDB_MODEL_CACHE=str(model_cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    report = tmp_path / "drill.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--short", "--seed", "1",
                          "--home", str(tmp_path / "drill"), "--json", str(report)],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    result = json.loads(report.read_text())
    figures = result["figures"]
    assert figures["violations"] == 0, result["violations"]
    # Every kind of action was taken, and the outage happened.
    assert set(figures["actions"]) == {
        "stall-collector-write", "kill-collector-write", "kill-learner-step", "kill-collector-generate",
        "kill-learner-publish", "term-collector", "kill-learner-buildlock", "kill-learner-record", "term-learner"}
    assert figures["outages"] == 1 and figures["learner_steps"] > 0 and figures["groups"] > 0


def test_the_storage_outage_drill_loses_nothing_and_stops_no_process(tmp_path, model_cache):
    """``--storage s3`` (issue 54): weights through a local S3 server that is stopped for a while,
    and a learner killed mid-upload, with collectors killed mid-generation around them; no
    database outage. Nothing lost, no process exits on its own (the learner waits and retries its
    upload; collectors report failed fetches and sample on), and every version the collectors
    loaded came from S3, verified."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("REFLEXDB_DATABASE_URL", "MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                        "MLFLOW_TRACKING_URI") and not k.startswith("AWS_")}
    env.update(REFLEXDB_MODEL_CACHE=str(model_cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    report = tmp_path / "drill.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--short", "--seed", "2",
                          "--storage", "s3", "--outages", "0",
                          "--actions", "storage-outage,kill-learner-upload,kill-collector-generate",
                          "--home", str(tmp_path / "drill"), "--json", str(report)],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    figures = json.loads(report.read_text())["figures"]
    assert figures["violations"] == 0
    assert set(figures["actions"]) == {"storage-outage", "kill-learner-upload", "kill-collector-generate"}
    assert figures["storage_outages"] >= 1 and figures["outages"] == 0
    assert figures["versions_loaded_from_s3"] > 0 and figures["learner_steps"] > 0 and figures["groups"] > 0
    # the outage was felt: the learner retried an upload, or a collector reported a failed fetch
    assert figures["upload_retries"] + figures["fetch_failures_reported"] > 0, figures
