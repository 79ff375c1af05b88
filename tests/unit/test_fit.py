"""The learner's memory estimate (trainer/fit.py) with the real configs of Qwen2.5-1.5B and Qwen3-8B
on an 80 GiB card, the refusal at start and the keys it names, and the activation factors measured
again with torch's saved-tensor hooks on tiny models of the same architectures."""

from __future__ import annotations

import json

import pytest
import torch
from reflexdb.trainer.engine import EngineSettings
from reflexdb.trainer.fit import (
    FitCheck,
    GiB,
    LearnerDoesNotFit,
    ModelShape,
    check_fit,
    check_start,
    estimate_memory,
    fixes,
    tokens_per_pass,
)

# config.json of Qwen/Qwen2.5-1.5B and Qwen/Qwen3-8B (the keys the estimate reads)
QWEN25_15B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
              "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
              "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True}
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 12288, "vocab_size": 151936, "tie_word_embeddings": False}
CARD = 80 * GiB  # an 80 GiB card, all of it free
BF16 = EngineSettings(device="cuda", dtype="bfloat16")


def test_the_parameters_of_the_real_configs():
    """Qwen2.5-1.5B: embedding 151936·1536 = 233,373,696 (tied: the head is the same weight); a layer
    q 1536² + k, v 1536·256 each + o 1536² + biases 1536 + 2·256 + MLP 3·1536·8960 + norms 2·1536 =
    46,797,824; × 28 + embedding + final norm 1536 = 1,543,714,304. Qwen3-8B: embedding and head
    151936·4096 each = 1,244,659,712; a layer 2·4096² + 2·4096·1024 + 3·4096·12288 + norms 2·4096
    + q/k norms 2·128 = 192,946,432; × 36 + both + 4096 = 8,190,735,360. transformers builds the same
    models on the meta device (no memory) with exactly these counts."""
    from transformers import AutoConfig, AutoModelForCausalLM

    for cfg, expected in ((QWEN25_15B, 1_543_714_304), (QWEN3_8B, 8_190_735_360)):
        assert ModelShape.from_config(cfg).parameters == expected
        hf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf)
        assert sum(p.numel() for p in model.parameters()) == expected  # a tied weight once


def test_8b_does_not_fit_one_card_as_it_stands_and_the_refusal_names_the_keys():
    """Qwen3-8B in bfloat16 on one 80 GiB card, 1024-token passes, ZeRO-0 (P = 8.19e9):
    weights 2P = 16.4 GB (15.3 GiB); gradients 2P bf16 + 4P float32 = 49.1 GB (45.8 GiB);
    optimizer state 12P (float32 master weights + AdamW's two moments) = 98.3 GB (91.5 GiB);
    activations 1024 tokens × (36 layers × (8·4096 + 5·(4096 + 1024) + 4·12288) + 4·4096) × 2 B
    = 7.8 GB; the head's 1024-token chunk × 151936 × (16 + 4) B = 3.1 GB: 163 GiB against 80.
    With the optimizer offloaded under ZeRO-2 the device keeps the weights, one 5e8-element bucket
    (1 GB), the activations and the head chunk, 26.5 GiB, and host memory holds 16P = 131 GB (122.1
    GiB: the float32 master weights, moments and gradients). So: one card fits with ZeRO-2 +
    offload when the host has the memory; with 120 GiB of host memory it does not, and the way
    left is ZeRO-3 over 3 cards (20P/3 = 54.6 GB each, plus the rest)."""
    shape = ModelShape.from_config(QWEN3_8B)
    e = estimate_memory(shape, BF16, tokens=1024, available=CARD)
    P = 8_190_735_360
    assert (e.weights, e.gradients, e.optimizer) == (2 * P, 6 * P, 12 * P)
    assert e.weights / 1e9 == pytest.approx(16.4, abs=0.05) and e.optimizer / 1e9 == pytest.approx(98.3, abs=0.05)
    assert e.activations_per_token == (36 * (8 * 4096 + 5 * 5120 + 4 * 12288) + 4 * 4096) * 2
    assert e.head == 1024 * 151936 * 20
    assert e.device / GiB == pytest.approx(162.9, abs=0.1) and not e.fits

    with pytest.raises(LearnerDoesNotFit) as exc:
        check_fit(shape, BF16, tokens=1024, longest_row=256, available=CARD, host_available=512 * GiB,
                  device_name="cuda:0")
    msg = str(exc.value)
    assert msg.startswith("the learner does not fit cuda:0 (estimated): Qwen3ForCausalLM, 8.19B parameters, bfloat16")
    for numbers in ("weights 15.3 GiB", "gradients 45.8 GiB", "optimizer state 91.5 GiB",
                    "1024 tokens a pass × 7.41 MiB a token", "= 162.9 GiB on the device of 80.0 GiB free"):
        assert numbers in msg
    assert "It would fit with learner.zero_stage: 2 and learner.offload_optimizer: true (26.5 GiB a device, " \
           "122.1 GiB of host memory)" in msg
    assert "learner.activation_checkpointing" not in msg and "micro_batch_tokens" not in msg  # they cannot help
    assert msg.endswith('learner.fit_check: false (docs/learner.md, "Will it fit?")')

    offloaded = estimate_memory(shape, EngineSettings(device="cuda", dtype="bfloat16", zero_stage=2,
                                                      offload_optimizer=True), tokens=1024, available=CARD)
    assert offloaded.fits and (offloaded.optimizer, offloaded.gradients) == (0, 0) and offloaded.host == 16 * P

    with pytest.raises(LearnerDoesNotFit) as exc:  # the host cannot hold the offloaded state
        check_fit(shape, BF16, tokens=1024, longest_row=256, available=CARD, host_available=120 * GiB)
    assert "It would fit with 3 learner ranks (GPUs) with learner.zero_stage: 3 (64.4 GiB a device)" in str(exc.value)


def test_15b_fits_one_card_and_long_passes_name_checkpointing_or_a_budget():
    """Qwen2.5-1.5B, bf16, ZeRO-0 (P = 1.54e9): weights 3.1 GB, gradients 9.3 GB, optimizer 18.5 GB,
    1024-token passes 2.9 GiB of activations (2.77 MiB a token: 28 × (8·1536 + 2·1792 + 4·8960)
    + 4·1536 elements of 2 bytes): 34.4 GiB, it fits. 32,768-token passes make 88.8 GiB of
    activations; checkpointing keeps 28 × 2·1536 elements a token and one layer's whole, 0.26
    MiB a token (8.4 GiB), or passes of at most 16,384 tokens fit (a power of two). ZeRO stages and
    offloads, which do not help enough alone, are not named."""
    shape = ModelShape.from_config(QWEN25_15B)
    assert estimate_memory(shape, BF16, tokens=1024, available=CARD).fits
    found = fixes(shape, BF16, tokens=32768, longest_row=2048, available=CARD)
    assert [f.keys for f in found[:2]] == [{"activation_checkpointing": True}, {"micro_batch_tokens": 16384}]
    assert all("zero_stage" not in f.keys or f.ranks for f in found)
    assert found[0].estimate.activations_per_token == (28 * 2 * 1536 + 51712) * 2
    # no budget below the longest row is offered: a longer row is a pass of its own
    assert next(f.keys for f in fixes(shape, BF16, tokens=32768, longest_row=20000, available=CARD)) == \
        {"activation_checkpointing": True}
    assert all(f.keys.get("micro_batch_tokens", 20000) >= 20000
               for f in fixes(shape, BF16, tokens=32768, longest_row=20000, available=CARD))


def test_zero_shards_by_stage_and_agrees_with_deepspeeds_model_state_estimates():
    """ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too, ZeRO-3 the weights (plus the
    gathered working set, 2 × the 622M-parameter embedding). DeepSpeed's own estimates of model
    states (no activations) give the same within 15%: ZeRO-2 offloaded 2P a GPU; ZeRO-3 over 8
    GPUs 4·largest layer + 18P/8 (ours counts 20P/8: the 16-bit weights' shard too)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import (
        estimate_zero2_model_states_mem_needs,
    )

    shape = ModelShape.from_config(QWEN3_8B)
    P = shape.parameters

    def est(**kw):
        return estimate_memory(shape, EngineSettings(device="cuda", dtype="bfloat16", **kw), world_size=8, tokens=16)

    z0, z1, z2, z3 = (est(zero_stage=s) for s in range(4))
    assert z1.optimizer == z0.optimizer // 8 and z2.gradients == 6 * P // 8 < z1.gradients
    assert z3.weights == 2 * P // 8 + 2 * 2 * shape.largest_module
    model_states = z3.weights + z3.gradients + z3.optimizer
    _, ds_gpu, _ = estimate_zero3_model_states_mem_needs(P, shape.largest_module, num_gpus_per_node=8,
                                                         cpu_offload=False)
    assert model_states == pytest.approx(ds_gpu, rel=0.15)
    off = est(zero_stage=2, offload_optimizer=True)
    _, ds_gpu = estimate_zero2_model_states_mem_needs(P, num_gpus_per_node=8, cpu_offload=True)
    assert off.weights + off.gradients + off.optimizer == ds_gpu == 2 * P


def test_tokens_per_pass():
    assert tokens_per_pass(1024, 8, 256) == 1024
    assert tokens_per_pass(1024, 8, 3000) == 3000  # a longer row is a pass of its own
    assert tokens_per_pass(None, 8, 256) == 2048


def _saved_bytes_per_token(config, tokens: int, checkpointing: bool) -> float:
    """Bytes the model saves for its backward pass per token (torch's saved-tensor hooks; each
    storage once, parameters left out)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=torch.randint(0, config.vocab_size, (1, tokens)), output_hidden_states=True,
              logits_to_keep=1, use_cache=False)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params) / tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_the_activation_factors_are_what_the_layers_save(arch):
    """The per-token activations of estimate_memory against what tiny bfloat16 models of each
    architecture (4 layers, hidden 128, MLP 3×, 2 kv heads) save for their backward pass, with and
    without activation checkpointing (measured on the CPU; without checkpointing a layer saves
    8·H + 2·(Q + K) + 4·I elements a token, Qwen3's q/k norms 3·(Q + K) more)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(arch, hidden_size=128, intermediate_size=384, num_attention_heads=4,
                                  num_key_value_heads=2, num_hidden_layers=4, vocab_size=512)
    shape = ModelShape.from_config(config)
    H, L = 128, 4
    full, kept = shape.activation_elements(False), shape.activation_elements(True)
    layer = (full - 4 * H) // L  # what one layer saves; checkpointed, each keeps 2·H and one is recomputed
    assert kept == L * 2 * H + layer
    settings = EngineSettings(dtype="bfloat16")
    assert estimate_memory(shape, settings, tokens=64).activations_per_token == full * 2
    assert _saved_bytes_per_token(config, 64, False) == pytest.approx(full * 2, rel=0.05)
    # the checkpointed forward saves the layers' inputs; the recomputed layer exists only in the backward
    assert _saved_bytes_per_token(config, 64, True) == pytest.approx(L * 2 * H * 2, rel=0.05)


def test_a_cpu_learner_counts_the_hosts_memory_and_refuses_at_start_before_loading(tmp_path):
    """On a CPU the device is the host: weights, gradients, optimizer and activations of all its
    ranks against its available memory. check_start reads only the model's config.json: a folder
    with Qwen3-8B's config and no weights is refused at once, on any machine (10^7-token passes
    need tens of TB)."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    settings = EngineSettings(device="cpu", dtype="float32")
    with pytest.raises(LearnerDoesNotFit, match=r"^the learner does not fit host memory \(estimated\): "
                                                r"Qwen3ForCausalLM, 8.19B parameters, float32, ZeRO-0, 1 rank") as exc:
        check_start(str(tmp_path), settings, FitCheck(tokens=10**7, longest_row=10**7), world_size=1,
                    ranks_per_host=2)
    assert "host memory" in str(exc.value) and "GiB available" in str(exc.value)
    e = estimate_memory(ModelShape.from_config(QWEN3_8B), settings, tokens=16, host_available=10**15, ranks_per_host=2)
    assert e.fits and e.host_total == 2 * e.device  # two ranks, each its own copy
    # a folder whose config the estimate cannot read is not checked, nor a mixture of experts
    for config in ({"model_type": "mamba"}, {**QWEN3_8B, "model_type": "qwen3_moe", "num_experts": 128}):
        (tmp_path / "config.json").write_text(json.dumps(config))
        assert check_start(str(tmp_path), settings, FitCheck(tokens=10**7), world_size=1, ranks_per_host=1) is None


def test_offload_keys_are_validated():
    from reflexdb.trainer.engine import resolve_settings

    from reflexdb.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="learner.offload_optimizer needs learner.zero_stage 1, 2 or 3"):
        parse_config({"run": "r", "learner": {"offload_optimizer": True}})
    with pytest.raises(ConfigError, match="learner.offload_params needs learner.zero_stage 3 \\(it is 2\\)"):
        parse_config({"run": "r", "learner": {"offload_params": True, "zero_stage": 2, "offload_optimizer": True}})
    learner = parse_config({"run": "r", "learner": {"zero_stage": 3, "offload_optimizer": True,
                                                    "offload_params": True}}).learner
    assert learner.offload_optimizer and learner.offload_params and learner.fit_check
    with pytest.raises(ValueError, match="offload_params needs ZeRO stage 3"):
        resolve_settings(EngineSettings(zero_stage=2, offload_params=True))
    with pytest.raises(ValueError, match="offload_optimizer needs ZeRO stage 1-3"):
        resolve_settings(EngineSettings(offload_optimizer=True))
