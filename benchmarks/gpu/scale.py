"""The GPU suite's ``scale`` stage (issue 62): the model sizes researchers train.

1. **Will it fit?** The learner's memory estimate (``reflexdb.trainer.fit``) of Qwen2.5-1.5B and
   Qwen3-8B on this card, at ZeRO-0, ZeRO-2 with the optimizer offloaded and ZeRO-3 with both
   offloads: what fits, and the keys the fit check names when it does not.
2. **Learner speed at real shapes**: random weights of each shape built on the card (bfloat16, no
   float32 copy), saved once, then GRPO steps of the product's DeepSpeed engine on quickstart-shaped
   rows (``suite.py``'s ``_learner_speed`` child, one process per configuration): tokens/s, seconds a
   step, peak GPU memory, and **model FLOP/s utilisation** = 6 x parameters x tokens a second over
   the card's measured bfloat16 matrix FLOP/s (the attention's FLOPs are not counted, so it
   understates long rows slightly). Target at 1.5B on one H100: >= 35 % (about 38,000 tokens/s).
   The 8B step with ZeRO-3 and the offloads on one card, if the estimate says it fits.
3. **Publish to generating** at the smaller shape: the learner's ``export_hf`` (bf16 shards and a
   manifest), then a ``fast`` engine on the same card loading the version by the local path and by
   shared memory and generating (``benchmarks/weights_bench.py``'s ``publish_to_generating``).
   Target at 1.5B on one machine: <= 2 s.

The dry run (``--dry-run``, CI) runs all of it on the CPU with tiny configs of the same
architectures (Qwen2, Qwen3), in float32.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_dir(arch: str, config: dict, device: str, dtype: Any, tokenizer_dir: str, out: Path,
              rollouts: Any) -> Path:
    """``out``: a saved model of ``arch`` with ``config``'s shapes and random weights (built on
    ``device`` in ``dtype``) and SmolLM2's tokenizer; made once."""
    from transformers import AutoTokenizer

    if (out / "config.json").exists():
        return out
    model = rollouts._random_model(arch, config, device, dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size="2GB")
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    del model
    gc.collect()
    return out


def fit_table(shapes: dict, card_bytes: int | None, tokens: int) -> list[dict]:
    """The fit estimate of each shape in three settings on this card."""
    import transformers

    from reflexdb.trainer.engine import EngineSettings
    from reflexdb.trainer.fit import ModelShape, estimate_memory

    rows = []
    settings = {"ZeRO-0": dict(zero_stage=0), "ZeRO-2 + offload_optimizer": dict(zero_stage=2, offload_optimizer=True),
                "ZeRO-3 + offloads": dict(zero_stage=3, offload_optimizer=True, offload_params=True)}
    for name, (arch, config) in shapes.items():
        cls = getattr(transformers, arch)
        cfg = getattr(transformers, cls.config_class.__name__)(**config)
        shape = ModelShape.from_config(cfg)
        for label, kw in settings.items():
            s = EngineSettings(device="cuda", dtype="bfloat16", activation_checkpointing=True, **kw)
            e = estimate_memory(shape, s, tokens=tokens, available=card_bytes)
            rows.append({"model": name, "settings": label, "fits": bool(e.fits),
                         "device_gib": e.device / 2**30, "host_gib": e.host_total / 2**30})
    return rows


def learner_speed(plan: Any, suite: Path, model: Path, name: str, zero: int, offload: bool, work: Path,
                  log: Any, card: dict) -> dict:
    """One configuration in its own process (``suite.py _learner_speed``)."""
    dtype = "bfloat16" if plan.device == "cuda" else "float32"
    cmd = [sys.executable, str(suite), "_learner_speed", "--config", f"{dtype}:off", "--model", str(model),
           "--rows", str(plan.scale_rows), "--micro-tokens", str(plan.scale_micro_tokens), "--to", str(work),
           "--device", plan.device, "--zero", str(zero)] + (["--offload"] if offload else [])
    log(f"scale: learner {name}, ZeRO-{zero}{' + offloads' if offload else ''}, {plan.scale_micro_tokens} tokens a pass")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    f = work / f"speed-{dtype}-off-{plan.scale_micro_tokens}.json"
    row = json.loads(f.read_text()) if f.exists() else {"error": f"exit {p.returncode}: " + (p.stderr or p.stdout)[-2000:]}
    f.unlink(missing_ok=True)
    row.update(model=name, zero=zero, offload=offload)
    if card.get("matmul_tflop_s") and row.get("flops_per_s"):
        row["mfu"] = row["flops_per_s"] / 1e12 / card["matmul_tflop_s"]
    return row


def publish_to_generating(plan: Any, root: Path, model: Path, work: Path, log: Any) -> list[dict]:
    """The learner's publish and a ``fast`` engine's load and first tokens, by the local path and
    by shared memory, on this machine."""
    import torch

    from reflexdb.collector.engines.fast import FastEngine
    from reflexdb.trainer.engine import EngineSettings, TrainingEngine

    bench = _module(root / "benchmarks" / "weights_bench.py", "reflexdb_weights_bench")
    dtype = "bfloat16" if plan.device == "cuda" else "float32"
    trainer = TrainingEngine(model, EngineSettings(device=plan.device, dtype=dtype, fsync=True), say=log)
    engine = FastEngine(model, device=plan.device, dtype=dtype, max_batch_size=8)
    sync = torch.cuda.synchronize if plan.device == "cuda" else None
    out = []
    try:
        for version, route in enumerate(("local", "shm", "local", "shm"), start=1):  # each twice: the first warms
            try:
                t = bench.publish_to_generating(trainer, engine, route, work / f"publish-{version}", version, sync=sync)
                out.append({"route": route, "warm": version > 2, **t})
                log(f"scale: publish to generating by {route}: {t['total']:.2f} s")
            except Exception:
                out.append({"route": route, "error": traceback.format_exc()[-2000:]})
    finally:
        engine.close()
        del trainer
        gc.collect()
        if plan.device == "cuda":
            torch.cuda.empty_cache()
    return out


def stage(plan: Any, work: Path, root: Path, tokenizer_dir: str, card: dict, log: Any) -> dict:
    import torch

    rollouts = _module(root / "benchmarks" / "gpu" / "rollouts.py", "reflexdb_gpu_rollouts")
    shapes = rollouts.TINY_SHAPES if plan.dry else rollouts.SHAPES
    card_bytes = torch.cuda.mem_get_info()[1] if plan.device == "cuda" else None
    result: dict = {"card": card, "fit": fit_table(shapes, card_bytes, plan.scale_micro_tokens), "learner": [],
                    "publish": []}
    dtype = torch.bfloat16 if plan.device == "cuda" else torch.float32
    suite = root / "benchmarks" / "gpu" / "suite.py"
    fits = {(r["model"], r["settings"]): r["fits"] for r in result["fit"]}
    dirs = {}
    for name, (arch, config) in shapes.items():
        t0 = time.perf_counter()
        try:
            dirs[name] = model_dir(arch, config, plan.device, dtype, tokenizer_dir, work / f"scale-{arch}", rollouts)
        except Exception:
            result["learner"].append({"model": name, "error": traceback.format_exc()[-2000:]})
            continue
        log(f"scale: {name} built and saved in {time.perf_counter() - t0:.0f} s")
        runs = [(0, False)] if fits.get((name, "ZeRO-0"), True) else []
        if not runs and fits.get((name, "ZeRO-3 + offloads")):
            runs = [(3, True)]
        if not runs:
            result["learner"].append({"model": name, "skipped": "the estimate says it does not fit one card"})
        for zero, offload in runs:
            result["learner"].append(learner_speed(plan, suite, dirs[name], name, zero, offload, work, log, card))
        if plan.device == "cuda":
            torch.cuda.empty_cache()
    first = next(iter(shapes))
    if first in dirs:
        result["publish"] = publish_to_generating(plan, root, dirs[first], work, log)
    result["pass"] = (all("error" not in r for r in result["learner"] + result["publish"])
                      and bool(result["learner"]) and bool(result["publish"]))
    return result
