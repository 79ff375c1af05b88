"""The CPU's two hot paths at fixed work, for A/B runs of two versions of reflexdb (issue 51).

The quickstart's time depends on what the model samples: a run whose policy learns to answer in
11 tokens trains faster than one that answers in 37, so two versions whose random draws differ
(issue 51 changed the ``hf`` engine's draws) cannot be compared by the quickstart's wall clock
alone. This script does the same work under either version:

- ``generate``: the ``hf`` engine (the CPU default) on SmolLM2-135M, 8 arithmetic prompts × 4
  samples, greedy (the draws play no part), 48 new tokens, EOS ignored, so every row decodes 48;
- ``step``: one GRPO learner step of the product's DeepSpeed engine on the CPU (float32, ZeRO-0)
  on a fixed batch of 32 quickstart-shaped rows in micro-batches of 8.

Each prints its seconds; time the whole process from outside with two versions' interpreters::

    python benchmarks/cpu_paths_bench.py generate     # or: step
"""

from __future__ import annotations

import os
import sys
import time


def generate() -> float:
    from reflexdb.collector.engines.base import SamplingParams
    from reflexdb.collector.engines.hf import HFEngine

    engine = HFEngine("smollm2", device="cpu", max_batch_size=32)
    prompts = [[{"role": "user", "content": f"What is {3 + i} + {i + 1}? Think step by step."}] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_new_tokens=48, stop_token_ids=())
    engine._eos_ids = []  # every row decodes all 48 tokens, whichever version
    t0 = time.perf_counter()
    groups = engine.generate(prompts, n=4, params=params)
    seconds = time.perf_counter() - t0
    assert sum(len(s.token_ids) for g in groups for s in g) == 32 * 48
    return seconds


def step() -> float:
    import torch

    from reflexdb.collector.engines import encode_prompt
    from reflexdb.models import resolve_model
    from reflexdb.trainer.advantages import group_advantages
    from reflexdb.trainer.batch import pack_sequences
    from reflexdb.trainer.engine import EngineSettings, TrainingEngine
    from reflexdb.trainer.losses.registry import get_loss_spec

    torch.manual_seed(0)
    settings = EngineSettings(device="cpu", zero_stage=0, micro_batch_size=8, accumulation_steps=4, lr=1e-6,
                              dtype="float32", fsync=False)
    engine = TrainingEngine(resolve_model("smollm2"), settings, say=lambda m: None)
    tok = engine.tokenizer
    pairs, rewards = [], []
    for i in range(32):
        prompt = encode_prompt(tok, [{"role": "user", "content": f"What is {3 + i % 7} + {1 + i % 5}?"}])
        text = "To add them, count up one at a time. " * (1 + i % 6) + f"The answer is {4 + i % 11}."
        pairs.append((prompt, tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]))
        rewards.append([1.0, 0.0, 0.5, 0.25][i % 4])
    adv = group_advantages(torch.tensor(rewards).view(-1, 4)).flatten()
    spec = get_loss_spec("grpo")
    params = spec.parse({})
    total = float(sum(len(r) for _, r in pairs))
    t0 = time.perf_counter()
    for start in range(0, 32, 8):
        ids, attn, P, T = pack_sequences(pairs[start:start + 8], engine.pad_id)
        logprobs, _ = engine.token_logprobs(ids, attn, P, T)
        mask = torch.arange(logprobs.shape[1])[None, :] < T[:, None]
        out = spec.call(logprobs.float(), logprobs.detach().float(), adv[start:start + 8], mask, params)
        engine.backward(out.loss * (float(mask.sum()) / total))
        engine.step()
    return time.perf_counter() - t0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    what = sys.argv[1] if len(sys.argv) > 1 else "generate"
    seconds = {"generate": generate, "step": step}[what]()
    print(f"{what}: {seconds:.3f} s")
