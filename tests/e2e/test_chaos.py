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
