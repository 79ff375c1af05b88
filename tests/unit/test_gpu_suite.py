"""`benchmarks/gpu/suite.py`: its CPU dry run end to end (what CI knows about the GPU path before a
GPU sees it), and its report, merge and refusal logic on their own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "suite.py"


def _suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_of_earlier_calls_are_merged_and_a_stage_measured_again_replaces_its_own(tmp_path):
    suite = _suite()
    keep = tmp_path / "keep"
    first = suite.Results(tmp_path / "a", keep, dry=False)
    first.put("probe", {"status": "ok", "python": "3.12.3", "cpus": 16, "torch": "2.11.0", "memory_gib": 128.0,
                        "gpu": {"name": "NVIDIA H200", "memory_gib": 139.8}})
    first.put("faiss", {"status": "ok", "gpu": False, "reason": "this FAISS has no GPU support"})
    second = suite.Results(tmp_path / "b", keep, dry=False)
    second.put("faiss", {"status": "ok", "gpu": True, "n": 1000, "dim": 576, "searches": {
        "unrestricted IVF": {"cpu_p50_ms": 3.0, "gpu_p50_ms": 0.5, "speedup": 6.0, "cpu_recall": 0.99,
                             "gpu_recall": 0.99}}})
    merged = json.loads((tmp_path / "b" / "gpu-results.json").read_text())
    assert set(merged["stages"]) == {"probe", "faiss"} and merged["stages"]["faiss"]["gpu"] is True
    md = (tmp_path / "b" / "gpu-results.md").read_text()
    assert "NVIDIA H200" in md and "| unrestricted IVF | 3.000 | 0.500 | 6.00 |" in md
    # a dry run never mixes with a GPU run's results
    assert suite.Results(tmp_path / "c", keep, dry=True).data["stages"] == {}


def test_a_failed_stage_is_reported_with_its_error_and_the_others_still_render(tmp_path):
    suite = _suite()
    r = suite.Results(tmp_path, None, dry=False)
    r.put("e2e", {"status": "error", "error": "Traceback ...\nRuntimeError: reflexdb run gpu-e2e-hf exited 1"})
    r.put("sglang", {"status": "not carried", "reason": "sglang is not installed; " + suite.SGLANG_BLOCKER})
    md = (tmp_path / "gpu-results.md").read_text()
    assert "**e2e**: error" in md and "exited 1" in md
    assert "sglang-kernel 0.4.1 (352.1 MB)" in md


def test_unknown_stages_are_refused_with_the_list(tmp_path, capsys):
    suite = _suite()
    assert suite.main(["--stages", "probe,warp", "--out", str(tmp_path)]) == 2
    assert "unknown stage(s) warp; stages: probe, correctness, engine, rollouts, learner, scale, faiss, e2e, async, sglang" in capsys.readouterr().err


def test_a_stage_without_its_modules_is_skipped_naming_them(monkeypatch):
    suite = _suite()
    monkeypatch.setitem(suite.NEEDS, "faiss", ("faiss", "no_such_module_here"))
    plan = suite.Plan(suite.parse(["--dry-run"]))
    r = suite.run_stage("faiss", plan, Path("."))
    assert r == {"status": "skipped", "reason": "missing modules: no_such_module_here"}
