"""The training engine's memory-bounded passes on the tiny model under real DeepSpeed: the chunked
vocabulary head gives the model's own log-probs, and a step cut into token-budgeted passes
(``learner.micro_batch_tokens``) makes the same update as the step in one pass."""

from __future__ import annotations

import pytest
import torch

from reflexdb.logprobs import response_logprobs
from reflexdb.models import resolve_model


def _engine(model_cache, **kw):
    from reflexdb.trainer.engine import EngineSettings, TrainingEngine

    torch.manual_seed(0)
    return TrainingEngine(resolve_model("tiny", model_cache), EngineSettings(lr=1e-3, micro_batch_size=6, **kw),
                          say=lambda msg: None)


def _batch(pad_id: int):
    from reflexdb.trainer.batch import Batch, pack_sequences

    gen = torch.Generator().manual_seed(3)
    shapes = [(4, 3), (7, 12), (5, 1), (3, 30), (9, 6), (6, 17)]  # (prompt, response) tokens: rows of 7-33
    pairs = [(torch.randint(5, 200, (p,), generator=gen).tolist(), torch.randint(5, 200, (r,), generator=gen).tolist())
             for p, r in shapes]
    ids, attn, P, T = pack_sequences(pairs, pad_id)
    B, Tm = len(pairs), int(T.max())
    mask = torch.arange(Tm)[None, :] < T[:, None]
    mask[2] = False  # an empty loss mask
    return Batch(group_ids=[1, 2], trajectory_ids=list(range(B)), group_index=torch.tensor([0, 0, 0, 1, 1, 1]),
                 rewards=torch.tensor([1.0, 0.0, 0.5, 0.25, 0.0, 1.0]), correct=torch.zeros(B, dtype=torch.bool),
                 valid=torch.tensor([True, True, True, True, False, True]), truncated=torch.zeros(B, dtype=torch.bool),
                 input_ids=ids, attention_mask=attn, prompt_lengths=P, response_lengths=T, response_mask=mask,
                 behaviour_logprobs=torch.zeros(B, Tm), policy_versions=torch.zeros(B, dtype=torch.long),
                 confidence=torch.full((B,), float("nan")), group_versions=[0, 0], group_kinds=["a", "a"])


def test_the_chunked_head_gives_the_models_own_logprobs(model_cache):
    engine = _engine(model_cache, head_chunk_tokens=5)
    b = _batch(engine.pad_id)
    lp, ent = engine.token_logprobs(b.input_ids, b.attention_mask, b.prompt_lengths, b.response_lengths,
                                    temperature=0.7, with_entropy=True, grad=False)
    with torch.no_grad():
        logits = engine.ds.module(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
    ref, ref_ent = response_logprobs(logits, b.input_ids, b.prompt_lengths, b.response_lengths, temperature=0.7,
                                     with_entropy=True)
    torch.testing.assert_close(lp, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_step_cut_by_the_token_budget_makes_the_same_update(model_cache, checkpointing):
    """GRPO on 6 rows (a NULL reward, an empty mask, non-binary rewards) in 2 micro-batches of 3:
    with a budget of 40 tokens they are cut into 5 passes ([7, 19], [6], [33], [15], [23]
    tokens: rows × longest ≤ 40, or a row alone); with activation checkpointing too. The loss,
    the gradient norm and the weights after the step are the uncut step's."""
    from reflexdb.trainer.advantages import group_advantages
    from reflexdb.trainer.losses import get_loss_spec
    from reflexdb.trainer.method_api.base import LossTerm
    from reflexdb.trainer.update import PolicyUpdate

    results = []
    for budget, ckpt in ((None, False), (40, checkpointing)):
        engine = _engine(model_cache, activation_checkpointing=ckpt, accumulation_steps=2)
        b = _batch(engine.pad_id)
        spec = get_loss_spec("grpo")
        term = LossTerm("policy", "grpo", spec.parse({}))
        update = PolicyUpdate(engine, [term], [spec], ref=None, rank=0, world=1, n_micro=2, lr=1e-3,
                              pi_old="recompute", temperature=1.0, max_tokens=budget)
        if budget:
            assert len(update.slices(b)) == 5
        adv = group_advantages(b.rewards.double(), b.group_index.tolist(), valid=b.valid)
        stats, norm, _ = update.optimize(b, b.behaviour_logprobs, None, adv, full=b, rows=[b.valid], mine=slice(0, 6),
                                         fresh=torch.ones(6, dtype=torch.bool))
        results.append((stats["loss"], norm, [p.detach().clone() for p in engine.ds.module.parameters()]))
    (loss_a, norm_a, w_a), (loss_b, norm_b, w_b) = results
    assert loss_b == pytest.approx(loss_a, abs=1e-6)
    assert norm_b == pytest.approx(norm_a, rel=1e-4)
    for a, b in zip(w_a, w_b):  # AdamW's first step moves each weight by about lr = 1e-3: 1% of it
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_no_pass_holds_the_logits_of_the_whole_micro_batch(model_cache, zero_stage):
    """A forward and backward pass of 6 rows (69 response tokens) with head_chunk_tokens 16: every
    tensor any operation makes (recorded by a dispatch mode, the backward pass and the chunks'
    recomputation included) that ends in the 49,152-way vocabulary holds at most 16 positions,
    on ZeRO-0 and on ZeRO-3 (whose head is gathered by its hooks; it used to take the model's
    [6, 31, V] logits). The log-probs, with and without gradients, are the model's own."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Widest(TorchDispatchMode):
        rows = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == vocab and \
                        tuple(t.shape) != (hidden, vocab):  # the head's weight transposed, [H, V]
                    self.rows = max(self.rows, t.numel() // vocab)
            return out

    engine = _engine(model_cache, head_chunk_tokens=16, zero_stage=zero_stage)
    vocab, hidden = engine.ds.module.config.vocab_size, engine.ds.module.config.hidden_size
    b = _batch(engine.pad_id)
    with Widest() as probe:
        lp, _ = engine.token_logprobs(b.input_ids, b.attention_mask, b.prompt_lengths, b.response_lengths,
                                      with_entropy=True)
        engine.backward(-(lp.sum()) / 100)
    assert int(b.response_lengths.sum()) == 69 and 0 < probe.rows <= 16
    with torch.no_grad():
        logits = engine.ds.module(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
    ref = response_logprobs(logits, b.input_ids, b.prompt_lengths, b.response_lengths)[0]
    torch.testing.assert_close(lp.detach(), ref, rtol=1e-5, atol=1e-5)
    no_grad, _ = engine.token_logprobs(b.input_ids, b.attention_mask, b.prompt_lengths, b.response_lengths, grad=False)
    torch.testing.assert_close(no_grad, ref, rtol=1e-5, atol=1e-5)  # the scorer's and π_old's passes


def test_a_step_with_the_optimizer_and_the_weights_offloaded_makes_the_same_update(model_cache):
    """learner.offload_optimizer (DeepSpeed's CPU Adam on the host's float32 partition) under ZeRO-2,
    and both offloads under ZeRO-3, against torch's AdamW under ZeRO-0: two steps of the same
    batch, float32. AdamW's first steps move each weight by about lr = 1e-3; the weights after two
    steps agree within 2e-5 (2% of a step: the order of float sums in the partitions), the
    gradient norms within 1e-4 relative."""
    import deepspeed
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    def two_steps(**kw):
        engine = _engine(model_cache, **kw)
        b = _batch(engine.pad_id)
        norms = []
        for _ in range(2):
            lp, _ = engine.token_logprobs(b.input_ids, b.attention_mask, b.prompt_lengths, b.response_lengths)
            engine.backward(-(lp * b.response_mask).sum() / 100)
            norms.append(engine.step())
        params = list(engine.ds.module.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=kw.get("zero_stage") == 3):
            weights = [p.detach().clone() for p in params]
        return engine, norms, weights

    _, norms, weights = two_steps()
    for kw in ({"zero_stage": 2, "offload_optimizer": True},
               {"zero_stage": 3, "offload_optimizer": True, "offload_params": True}):
        engine, n, w = two_steps(**kw)
        assert isinstance(engine.ds.optimizer.optimizer, DeepSpeedCPUAdam)
        assert n == pytest.approx(norms, rel=1e-4)
        for a, b in zip(weights, w):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
