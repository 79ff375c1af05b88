"""Packed rows in the learner's forward (``learner.packing``) on the tiny model under real
DeepSpeed: a micro-batch's rows concatenated without padding, position ids restarting at each
row, give the padded path's log-probs, entropies, loss and gradients, and feed the model no
padding; ``auto`` precision and packing resolve by device in one place."""

from __future__ import annotations

import pytest
import torch

from reflexdb.models import resolve_model

NULL = float("nan")

# (prompt, response) tokens: rows of 4 to 120 tokens, in two groups of 4
SHAPES = [(3, 1), (4, 60), (20, 5), (2, 2), (30, 90), (6, 17), (5, 40), (12, 3)]
REWARDS = [1.0, 0.25, NULL, 0.0, 0.5, 0.75, 0.0, 1.0]  # non-binary, one NULL


def _engine(model_cache, packing: str, **kw):
    from reflexdb.trainer.engine import EngineSettings, TrainingEngine

    torch.manual_seed(0)
    settings = EngineSettings(lr=1e-3, micro_batch_size=4, accumulation_steps=2, packing=packing, **kw)
    return TrainingEngine(resolve_model("tiny", model_cache), settings, say=lambda msg: None)


def _batch(pad_id: int):
    from reflexdb.trainer.batch import Batch, pack_sequences

    gen = torch.Generator().manual_seed(5)
    pairs = [(torch.randint(5, 200, (p,), generator=gen).tolist(), torch.randint(5, 200, (r,), generator=gen).tolist())
             for p, r in SHAPES]
    ids, attn, P, T = pack_sequences(pairs, pad_id)
    B, Tm = len(pairs), int(T.max())
    rewards = torch.tensor(REWARDS)
    valid = ~torch.isnan(rewards)
    mask = (torch.arange(Tm)[None, :] < T[:, None]) & valid[:, None]  # a NULL reward carries no loss
    return Batch(group_ids=[1, 2], trajectory_ids=list(range(B)), group_index=torch.tensor([0] * 4 + [1] * 4),
                 rewards=rewards.nan_to_num(0.0), correct=torch.zeros(B, dtype=torch.bool), valid=valid,
                 truncated=torch.zeros(B, dtype=torch.bool), input_ids=ids, attention_mask=attn, prompt_lengths=P,
                 response_lengths=T, response_mask=mask, behaviour_logprobs=torch.zeros(B, Tm),
                 policy_versions=torch.zeros(B, dtype=torch.long), confidence=torch.full((B,), NULL),
                 group_versions=[0, 0], group_kinds=["a", "a"])


def test_concat_rows_by_hand():
    from reflexdb.trainer.batch import concat_rows

    ids = torch.tensor([[1, 2, 0], [3, 0, 0], [4, 5, 6]])
    packed, positions, starts = concat_rows(ids, torch.tensor([2, 1, 3]))
    assert packed.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert positions.tolist() == [[0, 1, 0, 0, 1, 2]]
    assert starts.tolist() == [0, 2, 3]


def test_token_slices_of_packed_rows_cut_by_their_sum():
    from reflexdb.trainer.update import token_slices

    lengths = torch.tensor([10, 10, 30, 10, 5, 5, 100, 5])
    # budget 40, halves [10, 10, 30, 10] and [5, 5, 100, 5]: 10 + 10 = 20, + 30 = 50 > 40, cut;
    # 30 + 10 = 40 fits. 5 + 5 = 10, + 100 > 40, cut; [100] alone (longer than the budget); [5].
    # Padded, the first half alone took three passes (3 × 30 = 90, 2 × 30 = 60 > 40).
    assert token_slices(lengths, 2, 40, packed=True) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 7),
                                                         slice(7, 8)]
    assert token_slices(lengths, 2, None, packed=True) == [slice(0, 4), slice(4, 8)]


@pytest.mark.parametrize("grad", [False, True])
def test_packed_rows_give_the_padded_logprobs_and_entropies(model_cache, grad):
    padded, packed = _engine(model_cache, "off", head_chunk_tokens=7), _engine(model_cache, "on", head_chunk_tokens=7)
    assert not padded.packed and packed.packed
    b = _batch(padded.pad_id)
    out = [e.token_logprobs(b.input_ids, b.attention_mask, b.prompt_lengths, b.response_lengths, temperature=0.7,
                            with_entropy=True, grad=grad) for e in (padded, packed)]
    (lp_a, ent_a), (lp_b, ent_b) = out
    assert lp_a.shape == lp_b.shape == ent_b.shape == (8, 90)  # [B, T]
    torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, rtol=0, atol=1e-5)
    assert lp_b[0, 1:].eq(0).all() and ent_b[3, 2:].eq(0).all()  # 0 past each response's end, as padded
    assert lp_b.requires_grad == grad


def test_the_packed_forward_feeds_no_padding(model_cache):
    """The tokens that reach the model's embedding: Σ (P_i + T_i) = 300 in one row packed, against
    8 rows × 120 = 960 padded."""
    b = _batch(0)
    fed = {}
    for packing in ("off", "on"):
        engine = _engine(model_cache, packing)

        def seen(module, args, packing=packing):
            fed[packing] = tuple(args[0].shape)

        hook = engine.ds.module.get_input_embeddings().register_forward_pre_hook(seen)
        engine.token_logprobs(b.input_ids, b.attention_mask, b.prompt_lengths, b.response_lengths, grad=False)
        hook.remove()
    total = int((b.prompt_lengths + b.response_lengths).sum())
    assert total == sum(p + r for p, r in SHAPES) == 300
    assert fed == {"off": (8, 120), "on": (1, total)}


@pytest.mark.parametrize("budget", [None, 128])
def test_a_packed_step_makes_the_padded_steps_loss_and_gradients(model_cache, budget):
    """GRPO on 8 rows of 4 to 120 tokens (non-binary rewards, a NULL one) in 2 micro-batches of 4,
    through PolicyUpdate as the learner runs it: the loss, the mean entropy, the gradient of every
    parameter at the optimizer step (accumulated over the passes) and its norm are the padded
    step's. With a budget of 128 tokens (rows of 4, 64, 25, 4 | 120, 23, 45, 15 tokens) the padded
    step takes 5 passes, rows × longest: [4, 64] [25, 4] | [120] [23, 45] [15]; the packed one 3,
    the sum of the rows' lengths: [4, 64, 25, 4] | [120] [23, 45, 15]. A different cut, the same
    gradient."""
    from reflexdb.trainer.advantages import group_advantages
    from reflexdb.trainer.losses import get_loss_spec
    from reflexdb.trainer.method_api.base import LossTerm
    from reflexdb.trainer.update import PolicyUpdate

    results = []
    for packing in ("off", "on"):
        engine = _engine(model_cache, packing)
        b = _batch(engine.pad_id)
        spec = get_loss_spec("grpo")
        term = LossTerm("policy", "grpo", spec.parse({}))
        update = PolicyUpdate(engine, [term], [spec], ref=None, rank=0, world=1, n_micro=2, lr=1e-3,
                              pi_old="recompute", temperature=1.0, max_tokens=budget, packed=engine.packed)
        if budget:
            assert len(update.slices(b)) == (3 if engine.packed else 5)
        grads: list[torch.Tensor] = []
        step = engine.step

        def spy(engine=engine, step=step):  # the gradient the optimizer is about to apply
            if engine.ds.is_gradient_accumulation_boundary():
                grads.extend(p.grad.detach().clone() for p in engine.ds.module.parameters())
            return step()

        engine.step = spy
        adv = group_advantages(torch.tensor(REWARDS).double(), b.group_index.tolist())
        assert adv[2] == 0 and torch.isfinite(adv).all()
        stats, norm, entropy = update.optimize(b, b.behaviour_logprobs, None, adv, full=b, rows=[b.valid],
                                               mine=slice(0, 8), fresh=torch.ones(8, dtype=torch.bool))
        results.append((stats["loss"], entropy, norm, grads))
    (loss_a, ent_a, norm_a, g_a), (loss_b, ent_b, norm_b, g_b) = results
    assert loss_a != 0.0 and loss_b == pytest.approx(loss_a, abs=1e-5)
    assert ent_b == pytest.approx(ent_a, abs=1e-5)
    assert norm_b == pytest.approx(norm_a, rel=1e-5)
    assert len(g_a) == len(g_b) > 0
    for a, b in zip(g_a, g_b):
        assert float(torch.linalg.vector_norm(b - a)) <= 1e-5 * float(torch.linalg.vector_norm(a)) + 1e-12


def test_the_reference_models_logprobs_packed_are_the_padded_ones(model_cache):
    """The reference model (a plain Hugging Face model, no DeepSpeed) is fed as the policy is. It
    is loaded as for generation (``use_cache`` on): with a KV cache transformers would not look
    for packed rows, and they saw each other (|Δ| 0.34 before the forward turned the cache off)."""
    from transformers import AutoModelForCausalLM

    from reflexdb.trainer.update import PolicyUpdate

    engine = _engine(model_cache, "off")
    ref = AutoModelForCausalLM.from_pretrained(resolve_model("tiny", model_cache)).eval()
    b = _batch(engine.pad_id)
    out = [PolicyUpdate(engine, [], [], ref=ref, rank=0, world=1, n_micro=2, lr=1e-3, pi_old="recompute",
                        temperature=0.7, max_tokens=128, packed=packed).ref_logprobs(b) for packed in (False, True)]
    assert out[0].shape == (8, 90) and out[0].abs().sum() > 0
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-5)


def test_auto_precision_and_packing_resolve_by_device(monkeypatch):
    from reflexdb.trainer.engine import EngineSettings, resolve_settings

    def resolved(**kw):
        s = resolve_settings(EngineSettings(dtype="auto", packing="auto", **kw))
        return s.dtype, s.packing

    assert resolved() == ("float32", "off")  # CPU: as before auto existed
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    # packing auto is padded on CUDA too: SDPA's dense block mask made packed passes 2-4x slower (H200)
    assert resolved(device="cuda") == resolved(device="cuda:1") == ("bfloat16", "off")
    assert resolved(device="cuda", zero_stage=3) == ("bfloat16", "off")  # ZeRO-3 keeps padded rows
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolved(device="cuda") == ("float32", "off")
    # what is asked for is kept
    s = resolve_settings(EngineSettings(device="cuda", dtype="float32", packing="off"))
    assert (s.dtype, s.packing) == ("float32", "off")
    with pytest.raises(ValueError, match="ZeRO"):
        resolve_settings(EngineSettings(packing="on", zero_stage=3))


def test_the_learner_config_defaults_to_auto_and_refuses_packing_under_zero3():
    from reflexdb.config import ConfigError, parse_config

    cfg = parse_config({"run": "r"})
    assert (cfg.learner.dtype, cfg.learner.packing) == ("auto", "auto")
    assert parse_config({"run": "r", "learner": {"packing": "auto", "zero_stage": 3}}).learner.packing == "auto"
    with pytest.raises(ConfigError, match="learner.packing 'on' needs learner.zero_stage 0-2"):
        parse_config({"run": "r", "learner": {"packing": "on", "zero_stage": 3}})
