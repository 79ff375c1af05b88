"""The GPU suite's ``rollouts`` stage (issue 61): every method's rollouts through the ``fast`` engine
against the ``hf`` loop, and long answers at real model sizes.

1. **Methods.** Each example config's collector (GRPO, NexGRPO, LTE, R3L with
   ``r3l.decoding: json_schema``, CLEANER's tool episodes) runs in this process against one
   embedded PostgreSQL, first with the ``hf`` engine, then with ``fast``, for the same number of
   groups, with no learner (``max_staleness`` high: admission never holds it). Reported: the
   tokens each sampled and the seconds it spent generating (the collector's own ``generate``
   phase), so **tokens/s while generating**, and fast's speed-up. The targets: R3L and CLEANER
   (multi-turn episodes with kept caches, JSON reflections, tool calls and rollbacks) at least 10x
   their ``hf`` speed.
2. **Sizes.** Random weights of a real architecture's shapes built on the device (Qwen2.5-1.5B,
   Qwen3-8B; the dry run: tiny configs of the same architectures), ``rows`` rows decoding
   ``new_tokens`` tokens each with no stop: generated tokens/s, decode steps, peak memory, and the
   share of the memory-bandwidth bound (the weights and the KV bytes a step reads, over the card's
   measured copy bandwidth). The targets (one H100): Qwen2.5-1.5B >= 30,000 tokens/s and Qwen3-8B
   >= 8,000 tokens/s at 256 rows x 1,024 new tokens.
3. **The context.** Rows whose prompts nearly fill the context (prefilled in chunks), more of them
   than the pool holds at once: no out-of-memory; the pool makes them wait or preempts.

Run as part of ``benchmarks/gpu/suite.py`` (``--stages rollouts``); its ``--dry-run`` runs all of
it on the CPU with the tiny model in CI.
"""

from __future__ import annotations

import gc
import time
import traceback
from pathlib import Path
from typing import Any

#: the methods' example configs (examples/arithmetic-<name>.yaml)
METHODS = ("grpo", "nexgrpo", "lte", "r3l", "cleaner")
#: real shapes (config.json of each model), built with random weights on the device
SHAPES = {
    "Qwen2.5-1.5B": ("Qwen2ForCausalLM", dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, sliding_window=None, use_sliding_window=False)),
    "Qwen3-8B": ("Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, sliding_window=None, use_sliding_window=False)),
}
#: the dry run's stand-ins: the same architectures, tiny
TINY_SHAPES = {
    "Qwen2 (tiny)": ("Qwen2ForCausalLM", dict(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, sliding_window=None,
        use_sliding_window=False)),
    "Qwen3 (tiny)": ("Qwen3ForCausalLM", dict(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
        sliding_window=None, use_sliding_window=False)),
}


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def method_config(plan: Any, method: str, engine: str, location: str, root: Path) -> dict:
    """``examples/arithmetic-<method>.yaml`` for this stage: the engine, the device, no learner to
    wait for, the plan's batch sizes."""
    import yaml

    cfg = yaml.safe_load((root / "examples" / f"arithmetic-{method}.yaml").read_text())
    cfg["run"] = f"rollouts-{method}-{engine}"
    cfg["model"] = location
    cfg["max_staleness"] = 1000  # no learner: admission does not hold the collector within the stage
    c = cfg["collector"]
    c.update(engine=engine, device=plan.device, tasks_per_batch=plan.rollout_tasks, progress_every_s=3600)
    if plan.dry:
        c["group_size"] = 4
        c["sampling"]["max_new_tokens"] = min(c["sampling"]["max_new_tokens"], 8)
        cfg["tasks"].update(train_size=16, eval_size=4)
        if method == "r3l":
            cfg["r3l"]["max_tokens"] = 48
    cfg.setdefault("learner", {})["device"] = plan.device
    return cfg


def methods(plan: Any, store: Any, location: str, root: Path, log: Any) -> list[dict]:
    """Each method's collector on each engine: tokens/s while generating."""
    import torch

    from reflexdb.collector.engines.fast import FastEngine
    from reflexdb.collector.engines.hf import HFEngine
    from reflexdb.collector.runner import Collector
    from reflexdb.config import parse_config

    dtype = "bfloat16" if plan.device == "cuda" else "float32"
    out = []
    for kind in ("hf", "fast"):
        engine = (FastEngine if kind == "fast" else HFEngine)(model=location, device=plan.device, dtype=dtype,
                                                             max_batch_size=plan.rollout_slots if kind == "fast" else
                                                             plan.rollout_hf_rows)
        try:
            for method in METHODS:
                row: dict = {"method": method, "engine": kind}
                try:
                    cfg = parse_config(method_config(plan, method, kind, location, root))
                    c = Collector(cfg, store, engine, echo=lambda msg: None)
                    c.setup()
                    t0 = time.perf_counter()
                    c.run(max_groups=plan.rollout_groups, max_seconds=plan.rollout_seconds)
                    _sync(plan.device)
                    ph = c.phase_seconds()
                    row.update(groups=c.stats.groups, tokens=ph["tokens"], generate_s=ph["generate"],
                               wall_s=time.perf_counter() - t0,
                               tokens_per_s=ph["tokens"] / ph["generate"] if ph["generate"] else float("nan"))
                    log(f"rollouts {method} {kind}: {row['groups']} groups, {row['tokens']} tokens, "
                        f"{row['tokens_per_s']:.0f} tokens/s while generating")
                except Exception:
                    row["error"] = traceback.format_exc()[-2000:]
                    log(f"rollouts {method} {kind}: error {row['error'].strip().splitlines()[-1]}")
                out.append(row)
        finally:
            engine.close()
            del engine
            gc.collect()
            if plan.device == "cuda":
                torch.cuda.empty_cache()
    by = {(r["method"], r["engine"]): r for r in out}
    for r in out:
        if r["engine"] == "fast":
            hf = by.get((r["method"], "hf"), {})
            r["speedup"] = r.get("tokens_per_s", float("nan")) / hf.get("tokens_per_s", float("nan"))
    return out


def _random_model(arch: str, config: dict, device: str, dtype: Any) -> Any:
    """A model of ``arch`` with ``config``'s shapes and random weights, built on ``device`` in
    ``dtype`` (no float32 copy, no file)."""
    import torch
    import transformers

    cls = getattr(transformers, arch)
    cfg = getattr(transformers, cls.config_class.__name__)(**config)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = cls(cfg)
    finally:
        torch.set_default_dtype(before)
    return model.eval()


def sizes(plan: Any, tokenizer_dir: str, card: dict, log: Any) -> list[dict]:
    """Long answers at real shapes: tokens/s, the bandwidth bound's share, peak memory; and rows
    that fill the context."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from reflexdb.collector.engines.base import SamplingParams
    from reflexdb.collector.engines.fast import FastEngine
    from reflexdb.collector.engines.model import LoadedModel

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    dtype = torch.bfloat16 if plan.device == "cuda" else torch.float32
    rng = np.random.default_rng(0)
    out = []
    for name, (arch, config) in (TINY_SHAPES if plan.dry else SHAPES).items():
        row: dict = {"model": name, "rows": plan.size_rows, "new_tokens": plan.size_new_tokens}
        engine = None
        try:
            if plan.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            model = _random_model(arch, config, plan.device, dtype)
            weights = sum(p.numel() * p.element_size() for p in model.parameters())
            engine = FastEngine(model=LoadedModel.from_module(model, tok, name), max_batch_size=plan.size_rows)
            engine.lm.eos_ids = []  # random weights: every row decodes all its tokens
            row.update(weights_gib=weights / 2**30, plan=engine.plan)
            vocab = min(config["vocab_size"], len(tok))
            prompts = [rng.integers(10, vocab, plan.size_prompt).tolist() for _ in range(plan.size_rows // 8)]
            params = SamplingParams(temperature=1.0, max_new_tokens=plan.size_new_tokens, seed=1)
            t0 = time.perf_counter()
            engine.generate(prompts, n=8, params=params)  # warm-up: captures every block-table width's graph
            _sync(plan.device)
            row["first_call_s"] = time.perf_counter() - t0
            steps0 = engine.steps
            t0 = time.perf_counter()
            groups = engine.generate(prompts, n=8, params=params)
            _sync(plan.device)
            seconds = time.perf_counter() - t0
            tokens = sum(len(s.token_ids) for g in groups for s in g)
            steps = engine.steps - steps0
            per_token = engine.runner.bytes_per_token(engine.lm.dtype)
            # the KV a step reads: every slot's gathered table width (the bucket), averaged over the answer
            ctx = plan.size_prompt + plan.size_new_tokens / 2
            kv_read = plan.size_rows * ctx * per_token
            row.update(tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds, steps=steps,
                       ms_per_step=1000 * seconds / max(steps, 1), kv_bytes_per_step=kv_read,
                       peak_gib=torch.cuda.max_memory_allocated() / 2**30 if plan.device == "cuda" else None,
                       preemptions=engine.scheduler.preemptions)
            if card.get("copy_tb_s"):
                bound = plan.size_rows * card["copy_tb_s"] * 1e12 / (weights + kv_read)  # tokens/s if bandwidth-bound
                row.update(bandwidth_bound_tokens_per_s=bound, bandwidth_share=row["tokens_per_s"] / bound)
            log(f"rollouts {name}: {row['tokens_per_s']:.0f} tokens/s at {plan.size_rows} rows x "
                f"{plan.size_new_tokens} new tokens")
            # the context: rows whose prompts nearly fill it, more than the pool holds at once
            long = engine.context - plan.context_new_tokens
            prompts = [rng.integers(10, vocab, long).tolist() for _ in range(plan.context_rows)]
            t0 = time.perf_counter()
            groups = engine.generate(prompts, n=1, params=SamplingParams(temperature=1.0, seed=2,
                                                                         max_new_tokens=plan.context_new_tokens))
            _sync(plan.device)
            row["context"] = {"rows": plan.context_rows, "prompt_tokens": long, "seconds": time.perf_counter() - t0,
                              "all_answered": all(len(g[0].token_ids) == plan.context_new_tokens for g in groups),
                              "preemptions": engine.scheduler.preemptions - row["preemptions"],
                              "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if plan.device == "cuda" else None}
        except Exception:
            row["error"] = traceback.format_exc()[-2000:]
            log(f"rollouts {name}: error {row['error'].strip().splitlines()[-1]}")
        finally:
            if engine is not None:
                engine.close()
            engine = model = None
            gc.collect()
            if plan.device == "cuda":
                torch.cuda.empty_cache()
        out.append(row)
    return out


def stage(plan: Any, work: Path, root: Path, location: str, tokenizer_dir: str, card: dict, log: Any) -> dict:
    """The stage's result: ``methods`` (one row per method and engine), ``sizes`` (one per shape)."""
    import sqlalchemy  # noqa: F401 - the store's

    from reflexdb import embedded, migrate
    from reflexdb.db import make_engine
    from reflexdb.store import Store

    result: dict = {"model": location, "card": card}
    url = embedded.server_uri(work / "rollouts-pgdata")
    try:
        engine = make_engine(url)
        migrate.upgrade(engine)
        store = Store(engine)
        result["methods"] = methods(plan, store, location, root, log)
        engine.dispose()
    finally:
        embedded.stop(work / "rollouts-pgdata")
    result["sizes"] = sizes(plan, tokenizer_dir, card, log)
    speed = {r["method"]: r.get("speedup") for r in result["methods"] if r["engine"] == "fast"}
    result["targets"] = {
        "r3l_10x": (speed.get("r3l") or 0) >= 10, "cleaner_10x": (speed.get("cleaner") or 0) >= 10,
        **{f"{r['model']}": r.get("tokens_per_s") for r in result["sizes"]},
    }
    result["pass"] = (all("error" not in r for r in result["methods"] + result["sizes"])
                      and all(r.get("context", {}).get("all_answered") for r in result["sizes"]))
    return result
