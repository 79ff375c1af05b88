"""The GPU suite's CPU dry run: every stage measured on the tiny model (a child process)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from tests.processes import PARENT_ONLY
from tests.unit.test_gpu_suite import SCRIPT  # noqa: F401


def _dry_run(tmp_path, model_cache, stages: str):
    """The suite's dry run of ``stages`` in a child process; its results and the two output folders."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in PARENT_ONLY and k != "REFLEXDB_DATABASE_URL"}
    env.update(REFLEXDB_MODEL_CACHE=str(model_cache), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    out, keep = tmp_path / "out", tmp_path / "keep"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--stages", stages, "--out", str(out),
                           "--results-dir", str(keep), "--work", str(tmp_path / "work")],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r = json.loads((out / "gpu-results.json").read_text())
    assert r["dry_run"] is True and set(r["stages"]) == set(stages.split(","))
    assert (keep / "gpu-results.json").read_text() == (out / "gpu-results.json").read_text()
    return r["stages"], (out / "gpu-results.md").read_text()


def test_dry_run_measures_every_stage_on_the_cpu(model_cache, tmp_path):
    """The suite with the tiny model on the CPU, the stages that need no `reflexdb run`: every stage
    runs its real code path (the hf engine against score(), DeepSpeed steps in child processes) and
    reports. (The two that run `reflexdb run` are the next test, so the two share CI's workers.)"""
    s, md = _dry_run(tmp_path, model_cache, "probe,correctness,engine,rollouts,learner,faiss,sglang")
    assert s["probe"]["status"] == "ok" and s["probe"]["cuda_available"] is False
    assert all(not m for m in s["probe"]["modules_missing"].values())

    c = s["correctness"]
    assert c["status"] == "ok" and c["pass"], json.dumps(c["learner"], indent=1)[:4000]
    fp32, bf16 = c["engine"]
    assert fp32["dtype"] == "float32" and fp32["max_abs_diff"] <= 1e-3 and fp32["tokens"] > 0
    assert fp32["embedding_shape_ok"] and fp32["finite"] and fp32["hidden_size"] == 64
    assert bf16["tolerance"] is None and bf16["max_abs_diff"] > 0  # measured, not assumed
    steps = {(x["device"], x["dtype"], x["zero"]): x for x in c["learner"]}
    assert steps[("cpu", "float32", 0)]["reference"]
    z2 = steps[("cpu", "float32", 2)]
    assert z2["grad_norm_rel_diff"] <= 1e-3 and z2["update_cosine"] >= 0.999  # ZeRO-2 = ZeRO-0
    for x in c["learner"]:
        assert "error" not in x and math.isfinite(x["grad_norm"]) and x["micro_batch"] < x["rows"]

    g = s["engine"]
    assert g["status"] == "ok" and g["pass"] and g["dtype"] == "float32"  # the fast engine = the hf loop
    assert [x["case"] for x in g["equivalence"]] == ["greedy", "t=1, top-p 0.9", "t=1, stop strings"]  # no compiling on a CPU
    assert {(x["engine"], x["rows"]) for x in g["sweep"]} == {("hf", 8), ("hf", 16), ("fast", 8), ("fast", 16),
                                                              ("fast (no CUDA graph)", 16)}
    assert all("error" not in x and x["tokens"] > 0 and x["tokens_per_s"] > 0 for x in g["sweep"])

    ro = s["rollouts"]  # every method's collector on both engines, and the architectures at their sizes
    assert ro["status"] == "ok" and ro["pass"], json.dumps(ro, indent=1, default=str)[:4000]
    assert {(m["method"], m["engine"]) for m in ro["methods"]} == {
        (m, e) for m in ("grpo", "nexgrpo", "lte", "r3l", "cleaner") for e in ("hf", "fast")}
    assert all(m["groups"] >= 1 and m["tokens"] > 0 and m["tokens_per_s"] > 0 for m in ro["methods"])
    assert [z["model"] for z in ro["sizes"]] == ["Qwen2 (tiny)", "Qwen3 (tiny)"]
    assert all(z["tokens"] == z["rows"] * z["new_tokens"] and z["context"]["all_answered"] for z in ro["sizes"])

    L = s["learner"]
    assert L["status"] == "ok" and L["pass"] and L["tokens_per_step"] > 0
    assert [(c["label"], c["micro_tokens"]) for c in L["configs"]] == [("float32, padded", 512), ("float32, packed", 512)]
    assert all(c["tokens_per_s"] > 0 and c["micro_batches"] > 1 for c in L["configs"])
    assert L["configs"][1]["micro_batches"] <= L["configs"][0]["micro_batches"]  # no padding counted

    assert s["faiss"]["status"] == "ok" and s["faiss"]["gpu"] is False and "no GPU support" in s["faiss"]["reason"]
    assert s["sglang"]["status"] == "not carried"
    for heading in ("Correctness on the device", "Engines", "**Rollouts**", "**Learner**", "Learner step", "FAISS on GPU"):
        assert heading in md


def test_dry_run_of_the_end_to_end_and_async_stages(model_cache, tmp_path):
    """`reflexdb run` with an embedded PostgreSQL and MLflow, and async runs at two staleness
    bounds, on the tiny model on the CPU; and the scale stage (issue 62) on tiny Qwen2 and Qwen3
    configs: the fit estimate, learner steps, publish to generating."""
    s, md = _dry_run(tmp_path, model_cache, "e2e,async,scale")
    e = s["e2e"]
    assert e["status"] == "ok" and e["steps"] == 2 and e["trajectories"] > 0 and e["trajectories_per_s"] > 0
    assert e["learner_tokens_per_s"] > 0 and e["eval_versions"] == [0, 2] and e["engine"] == "hf"
    assert e["collector_tokens"] > 0 and e["collector_tokens_per_s"] > 0
    assert 0 <= e["pass_at_1_before"] <= 1 and 0 <= e["pass_at_1_after"] <= 1
    a = s["async"]
    assert a["status"] == "ok" and [x["max_staleness"] for x in a["runs"]] == [0, 2]
    for x in a["runs"]:
        assert x["steps"] == 2 and x["seconds_per_step"] > 0 and 0 < x["learner_busy"] <= 1.5
    assert a["runs"][0]["speedup"] == 1.0 and a["runs"][0]["staleness_mean"] == 0

    for heading in ("End to end", "Async against sync"):
        assert heading in md
    sc = s["scale"]
    assert sc["status"] == "ok" and sc["pass"], json.dumps(sc, indent=1, default=str)[:4000]
    assert {f["model"] for f in sc["fit"]} == {"Qwen2 (tiny)", "Qwen3 (tiny)"} and all(f["fits"] for f in sc["fit"])
    assert [x["model"] for x in sc["learner"]] == ["Qwen2 (tiny)", "Qwen3 (tiny)"]
    assert all(x["tokens_per_s"] > 0 for x in sc["learner"])
    assert [x["route"] for x in sc["publish"]] == ["local", "shm", "local", "shm"] and all(x["total"] > 0 for x in sc["publish"])
    assert "**Scale**" in md
