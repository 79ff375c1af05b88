"""`benchmarks/scale_bench.py` at CI size: 1 and 2 collector processes for 2 s against the test server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.processes import PARENT_ONLY

# Starts processes and reads the model cache's tokenizer: the embedded pass of CI, like test_collect.

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "scale_bench.py"


def test_scale_bench_quick_path(pg_server_url, model_cache, tmp_path):
    import os

    out = tmp_path / "scale.json"
    env = {k: v for k, v in os.environ.items() if k not in PARENT_ONLY}
    env.update(REFLEXDB_MODEL_CACHE=str(model_cache), REFLEXDB_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--url", pg_server_url, "--writers", "1,2", "--seconds", "2",
                           "--warmup", "0.5", "--json-out", str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["errors_total"] == 0
    assert [r["writers"] for r in res["runs"]] == [1, 2]
    for r in res["runs"]:
        assert r["errors"] == {} and r["groups"] > 0 and r["groups_per_s"] > 0 and r["mb_per_s"] > 0
        assert len(r["groups_per_collector"]) == r["writers"] and sum(r["groups_per_collector"]) == r["groups"]
        assert 0 < r["fairness"]["jain"] <= 1
        assert r["write_ms"]["count"] > 0 and r["write_ms"]["p50"] <= r["write_ms"]["p99"]
        assert r["learner"]["samples"] > 0 and r["learner"]["read_ms"]["p50"] is not None
        assert r["learner"]["trajectories_per_sample"] == 64 * 8
        assert r["cpu"]["collectors_s"] > 0 and r["cpu"]["learner_s"] is not None
        # realistic shapes: 40-120 prompt tokens, 50-600 response tokens per turn, some multi-turn
        assert 40 <= r["shapes"]["prompt_tokens_mean"] <= 120 and r["shapes"]["response_tokens_mean"] >= 50
        assert r["stored_groups"] >= r["groups"]
    assert "| writers | groups/s |" in proc.stdout
