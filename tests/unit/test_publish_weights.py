"""What the learner publishes for collectors (issue 62): the weights in the training dtype, in
shards with their index and a manifest.json, written by the real ``export_hf`` (DeepSpeed on the
CPU, the tiny model), and loaded in place by the collector's engine."""

from __future__ import annotations

import json

import torch

from reflexdb import storage
from reflexdb.models import resolve_model


def test_export_writes_bfloat16_shards_with_index_and_manifest_and_the_engine_loads_them(tmp_path, model_cache):
    from reflexdb.collector.engines import make_engine
    from reflexdb.trainer.engine import EngineSettings, TrainingEngine
    from safetensors import safe_open

    torch.manual_seed(0)
    src = resolve_model("tiny", model_cache)
    eng = TrainingEngine(src, EngineSettings(micro_batch_size=2, dtype="bfloat16", publish_shard_bytes=100_000),
                         say=lambda msg: None)
    module = eng.ds.module
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.25)
    out = tmp_path / "v1"
    sha = eng.export_hf(out)
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) == 3 and (out / storage.INDEX).is_file() and not (out / "model.safetensors").exists()
    index = json.loads((out / storage.INDEX).read_text())["weight_map"]
    assert sorted(set(index.values())) == [p.name for p in shards]
    for f in shards:  # the training dtype, as the module holds it: half of float32
        with safe_open(str(f), framework="pt") as fh:
            assert {fh.get_slice(k).get_dtype() for k in fh.keys()} == {"BF16"}  # noqa: SIM118 - not a dict
    man = json.loads((out / "manifest.json").read_bytes())
    assert man["weights_sha256"] == sha == storage.weights_sha256(out)
    assert {f["name"] for f in man["files"]} == {p.name for p in out.iterdir()} - {"manifest.json"}
    sha2, man_sha = storage.manifest_digest(out)
    assert sha2 == sha and storage.verify_version(out, sha, man_sha)
    # the collector's engine (float32 on the CPU) takes them in place, shard by shard through the index
    engine = make_engine("hf", model=src, device="cpu")
    before = {id(p) for p in engine.model.parameters()}
    engine.load_weights(out)
    assert {id(p) for p in engine.model.parameters()} == before  # the same tensors: no rebuild
    want = module.state_dict()
    for name, p in engine.model.named_parameters():
        assert torch.equal(p, want[name].float()), name
