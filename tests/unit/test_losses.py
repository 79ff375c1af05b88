"""Losses and advantages against hand-computed values (arithmetic in the comments).

Unit tests of pure math: no database, no model.
"""

from __future__ import annotations

import math

import pytest
import torch
from reflexdb.trainer.advantages import (
    ADVANTAGE_TRANSFORMS,
    apply_advantage_transforms,
    clamp_negative,
    group_advantages,
    make_transform,
    positive_amplification,
)
from reflexdb.trainer.losses import (
    LOSSES,
    aggregate,
    dapo_loss,
    dr_grpo_loss,
    get_loss,
    grpo_loss,
    gspo_loss,
    opmd_loss,
    register_loss,
    sft_loss,
)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


# ---------------------------------------------------------------- aggregation


VALUES = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


def test_token_mean():
    # valid: 1, 2 | 4  ->  (1 + 2 + 4) / 3 = 7/3
    assert aggregate(VALUES, MASK, "token-mean").item() == pytest.approx(7 / 3)


def test_seq_mean_token_mean():
    # row 0: (1 + 2)/2 = 1.5; row 1: 4/1 = 4  ->  (1.5 + 4)/2 = 2.75
    assert aggregate(VALUES, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)


def test_seq_mean_token_sum_norm():
    # max_len 4: row 0: 3/4 = 0.75; row 1: 4/4 = 1  ->  (0.75 + 1)/2 = 0.875
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm", max_len=4).item() == pytest.approx(0.875)
    with pytest.raises(ValueError):
        aggregate(VALUES, MASK, "seq-mean-token-sum-norm")


def test_aggregation_empty_rows_and_nan_padding():
    values = t([[1.0, 2.0, float("nan")], [float("inf"), 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    # empty row 1 is left out of seq-mean: (1 + 2)/2 = 1.5; NaN/inf under the mask do not leak
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    # token-mean: (1 + 2)/2 = 1.5
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(1.5)
    # sum-norm keeps the constant normaliser over all B rows: (3/4 + 0)/2 = 0.375
    assert aggregate(values, mask, "seq-mean-token-sum-norm", max_len=4).item() == pytest.approx(0.375)
    # all empty: 0 with a graph
    v = values.clone().requires_grad_()
    out = aggregate(v, torch.zeros_like(mask), "seq-mean-token-mean")
    out.backward()
    assert out.item() == 0.0 and torch.equal(v.grad, torch.zeros_like(v))


def test_unknown_aggregation():
    with pytest.raises(ValueError):
        aggregate(VALUES, MASK, "sequence-sum")


# ---------------------------------------------------------------- GRPO / DAPO / Dr.GRPO

# Ratios ρ = exp(logprobs − old_logprobs) with old = 0:
#   row 0 (A = +1):  ρ = [1.0, 1.5, 0.5], all valid
#   row 1 (A = −2):  ρ = [1.1, 0.7, 2.0], third token padding
RATIOS = t([[1.0, 1.5, 0.5], [1.1, 0.7, 2.0]])
ADV = t([1.0, -2.0])
PMASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def _inputs():
    logprobs = RATIOS.log().requires_grad_()
    return logprobs, torch.zeros_like(RATIOS), ADV, PMASK


# Token losses −min(ρA, clip(ρ, 0.8, 1.2)A), ε = 0.2:
#   row 0: ρ=1.0: −min(1.0, 1.0) = −1.0;  ρ=1.5: −min(1.5, 1.2) = −1.2 (clipped);
#          ρ=0.5: −min(0.5, 0.8) = −0.5
#   row 1: ρ=1.1: −min(−2.2, −2.2) = 2.2;  ρ=0.7: −min(−1.4, −1.6) = 1.6 (clipped)
#   row sums: −2.7 (3 tokens), 3.8 (2 tokens)


def test_grpo_hand():
    lp, old, adv, mask = _inputs()
    out = grpo_loss(lp, old, adv, mask)
    # seq-mean-token-mean: (−2.7/3 + 3.8/2)/2 = (−0.9 + 1.9)/2 = 0.5
    assert out.loss.item() == pytest.approx(0.5)
    assert out.policy_loss.item() == pytest.approx(0.5)
    # clipped: row 0 token 1 and row 1 token 1 -> 2 of 5 valid tokens
    assert out.clip_frac.item() == pytest.approx(0.4)
    # ratio over valid tokens: (1.0 + 1.5 + 0.5 + 1.1 + 0.7)/5 = 0.96, max 1.5 (2.0 is padding)
    assert out.ratio_mean.item() == pytest.approx(0.96)
    assert out.ratio_max.item() == pytest.approx(1.5)
    assert out.num_tokens.item() == 5
    # approx_kl = mean((ρ−1) − log ρ) over valid tokens
    k3 = sum(r - 1 - math.log(r) for r in [1.0, 1.5, 0.5, 1.1, 0.7]) / 5
    assert out.approx_kl.item() == pytest.approx(k3)
    assert out.kl.item() == 0.0
    out.loss.backward()
    # d loss / d logprob = −A·ρ / (n_tokens_of_row · B) where unclipped, 0 where clipped:
    #   row 0: −1·1.0/6, 0, −1·0.5/6;   row 1: +2·1.1/4, 0, 0 (padding)
    expected = t([[-1.0 / 6, 0.0, -0.5 / 6], [2.2 / 4, 0.0, 0.0]])
    torch.testing.assert_close(lp.grad, expected)
    assert not out.policy_loss.requires_grad and not out.clip_frac.requires_grad


def test_grpo_token_mean_and_sum_norm():
    lp, old, adv, mask = _inputs()
    # token-mean: (−2.7 + 3.8)/5 = 0.22
    assert grpo_loss(lp, old, adv, mask, agg="token-mean").loss.item() == pytest.approx(0.22)
    # Dr.GRPO, L_max = 4: (−2.7/4 + 3.8/4)/2 = (−0.675 + 0.95)/2 = 0.1375
    assert dr_grpo_loss(lp, old, adv, mask, max_len=4).loss.item() == pytest.approx(0.1375)


def test_grpo_kl_k3():
    # B=1, T=2, ratio 1, A=0 -> surrogate 0. ref = [0, 0], logprobs = [0, log 2]:
    #   k3 = exp(ref−lp) − (ref−lp) − 1: token 0: 0; token 1: 0.5 + log 2 − 1 = 0.193147
    #   seq-mean-token-mean: 0.0965736; β = 0.1 -> loss 0.00965736
    lp = t([[0.0, math.log(2.0)]]).requires_grad_()
    out = grpo_loss(lp, lp.detach(), t([0.0]), torch.ones(1, 2, dtype=torch.bool), ref_logprobs=t([[0.0, 0.0]]), beta=0.1)
    assert out.kl.item() == pytest.approx((0.5 + math.log(2.0) - 1.0) / 2)
    assert out.loss.item() == pytest.approx(0.1 * (0.5 + math.log(2.0) - 1.0) / 2)
    out.loss.backward()
    # d k3/d lp = 1 − exp(ref − lp): token 1: 1 − 0.5 = 0.5; × β/2 = 0.025
    torch.testing.assert_close(lp.grad, t([[0.0, 0.025]]))
    with pytest.raises(ValueError):
        grpo_loss(lp, lp.detach(), t([0.0]), torch.ones(1, 2, dtype=torch.bool), beta=0.1)


def test_dapo_clip_higher_and_token_mean():
    lp, old, adv, mask = _inputs()
    out = dapo_loss(lp, old, adv, mask)
    # ε_high = 0.28: row 0 token 1: −min(1.5, 1.28) = −1.28; the rest as in GRPO (ε_low = 0.2)
    # token-mean: (−1 − 1.28 − 0.5 + 2.2 + 1.6)/5 = 1.02/5 = 0.204
    assert out.loss.item() == pytest.approx(0.204)


def test_dapo_overlong_filter():
    lp, old, adv, mask = _inputs()
    out = dapo_loss(lp, old, adv, mask, truncated=torch.tensor([False, True]))
    # row 1 truncated -> only row 0: (−1 − 1.28 − 0.5)/3 = −0.926667
    assert out.loss.item() == pytest.approx(-2.78 / 3)
    assert out.num_tokens.item() == 3
    out.loss.backward()
    assert torch.equal(lp.grad[1], torch.zeros(3, dtype=D))


# ---------------------------------------------------------------- GSPO


def test_gspo_hand():
    # old = 0; row 0: d = [0.3, −0.1, 0.1] -> mean 0.1 -> s = e^0.1 = 1.105171
    #          row 1: d = [−0.2, 0.0, (5.0 padding)] -> mean −0.1 -> s = e^−0.1 = 0.904837
    lp = t([[0.3, -0.1, 0.1], [-0.2, 0.0, 5.0]]).requires_grad_()
    old = torch.zeros(2, 3, dtype=D)
    adv = t([1.0, -1.0])
    s0, s1 = math.exp(0.1), math.exp(-0.1)
    # ε = 0.2 both sides, no clip active: (−s0·1 + s1·1)/2 = (−1.105171 + 0.904837)/2 = −0.100167
    out = gspo_loss(lp, old, adv, PMASK, clip_eps_low=0.2, clip_eps_high=0.2)
    assert out.loss.item() == pytest.approx((-s0 + s1) / 2)
    assert out.clip_frac.item() == 0.0
    assert out.ratio_mean.item() == pytest.approx((s0 + s1) / 2)
    out.loss.backward()
    # d/d lp_t of −A s / 2 = −A s / (2 |o|): row 0: −1.105171/6 each; row 1: +0.904837/4 each, padding 0
    torch.testing.assert_close(lp.grad, t([[-s0 / 6] * 3, [s1 / 4, s1 / 4, 0.0]]))


def test_gspo_default_clip_is_per_sequence():
    lp = t([[0.3, -0.1, 0.1], [-0.2, 0.0, 5.0]]).requires_grad_()
    out = gspo_loss(lp, torch.zeros(2, 3, dtype=D), t([1.0, -1.0]), PMASK)
    # defaults ε_low = 3e-4, ε_high = 4e-4:
    #   row 0: −min(1.105171, 1.0004) = −1.0004;  row 1: −min(−0.904837, −0.9997) = 0.9997
    #   (−1.0004 + 0.9997)/2 = −0.00035; both sequences clipped, zero gradient
    assert out.loss.item() == pytest.approx(-0.00035)
    assert out.clip_frac.item() == 1.0
    out.loss.backward()
    assert torch.equal(lp.grad, torch.zeros_like(lp))


# ---------------------------------------------------------------- OPMD and SFT

LOGP = t([[-1.0, -2.0, -0.5], [-0.1, -3.0, float("-inf")]])


def test_opmd_hand():
    lp = LOGP.clone().requires_grad_()
    adv = t([2.0, -1.0])
    out = opmd_loss(lp, lp.detach(), adv, PMASK)
    # −A·log π: row 0 (A=2): 2, 4, 1 -> mean 7/3; row 1 (A=−1): −0.1, −3 -> mean −1.55
    # (7/3 − 1.55)/2 = 0.391667; padding −inf does not leak
    assert out.loss.item() == pytest.approx((7 / 3 - 1.55) / 2)
    assert out.approx_kl.item() == 0.0
    out.loss.backward()
    # d/d lp = −A / (n_row · B): row 0: −2/6; row 1: +1/4; padding 0
    torch.testing.assert_close(lp.grad, t([[-1 / 3] * 3, [0.25, 0.25, 0.0]]))


def test_sft_hand():
    lp = LOGP.clone().requires_grad_()
    out = sft_loss(lp, None, None, PMASK)
    # token-mean of −log π: (1 + 2 + 0.5 + 0.1 + 3)/5 = 1.32
    assert out.loss.item() == pytest.approx(1.32)
    assert out.num_tokens.item() == 5
    out.loss.backward()
    torch.testing.assert_close(lp.grad, t([[-0.2] * 3, [-0.2, -0.2, 0.0]]))


# ---------------------------------------------------------------- registry


def test_registry_names_and_uniform_call():
    assert set(LOSSES) >= {"grpo", "dr_grpo", "dapo", "gspo", "opmd", "sft", "grpo_lambda"}
    torch.manual_seed(0)
    B, T = 4, 6
    old = -torch.rand(B, T, dtype=D)
    ref = -torch.rand(B, T, dtype=D)
    adv = torch.randn(B, dtype=D)
    mask = torch.rand(B, T) > 0.2
    params = {"dr_grpo": {"max_len": T}, "grpo_lambda": {"ref_logprobs": ref}}
    for name, fn in LOSSES.items():
        lp = (old + 0.1 * torch.randn(B, T, dtype=D)).requires_grad_()
        out = get_loss(name)(lp, old, adv, mask, **params.get(name, {}))
        assert out._fields[0] == "loss" and out.loss.dim() == 0
        out.loss.backward()
        assert torch.isfinite(lp.grad).all() and lp.grad.abs().sum() > 0, name
        assert all(not v.requires_grad for v in out[1:]), name
    with pytest.raises(KeyError, match="known"):
        get_loss("ppo2")
    with pytest.raises(ValueError):
        register_loss("grpo", opmd_loss)


# ---------------------------------------------------------------- advantages


def test_group_advantages_rows_sample_std():
    # group [1, 0, 0, 1]: mean 0.5, sample std sqrt((4 × 0.25)/3) = 0.577350
    #   A = ±0.5/(0.577350 + 1e-6) = ±0.866024  (population std 0.5 would give ±1)
    # group [1, 1, 1, 1]: std 0 -> A = 0/(0 + 1e-6) = 0
    adv = group_advantages(t([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(adv, t([[a, -a, -a, a], [0.0, 0.0, 0.0, 0.0]]))


def test_group_advantages_ids_and_scale_none():
    rewards = t([1.0, 0.0, 2.0, 0.0, 1.0, 4.0])
    ids = torch.tensor([7, 3, 7, 3, 3, 7])
    # group 7: [1, 2, 4], mean 7/3, sample var ((4/3)² + (1/3)² + (5/3)²)/2 = (42/9)/2 = 7/3
    # group 3: [0, 0, 1], mean 1/3, sample var ((1/3)² + (1/3)² + (2/3)²)/2 = 1/3
    s7, s3 = math.sqrt(7 / 3), math.sqrt(1 / 3)
    expected = t([(1 - 7 / 3) / (s7 + 1e-6), (0 - 1 / 3) / (s3 + 1e-6), (2 - 7 / 3) / (s7 + 1e-6),
                  (0 - 1 / 3) / (s3 + 1e-6), (1 - 1 / 3) / (s3 + 1e-6), (4 - 7 / 3) / (s7 + 1e-6)])
    torch.testing.assert_close(group_advantages(rewards, ids), expected)
    # Python labels (task ids) work the same
    labels = ["b", "a", "b", "a", "a", "b"]
    torch.testing.assert_close(group_advantages(rewards, labels), expected)
    # Dr.GRPO: r − mean only
    none = t([1 - 7 / 3, -1 / 3, 2 - 7 / 3, -1 / 3, 2 / 3, 4 - 7 / 3])
    torch.testing.assert_close(group_advantages(rewards, ids, scale="none"), none)


def test_group_of_one_gets_zero():
    # group 5 has a single member: no baseline -> 0; group 1: [0, 2] -> mean 1, std sqrt(2) -> ∓0.707106
    adv = group_advantages(t([3.0, 0.0, 2.0]), torch.tensor([5, 1, 1]))
    a = 1 / (math.sqrt(2) + 1e-6)
    torch.testing.assert_close(adv, t([0.0, -a, a]))


def test_positive_amplification_hand():
    rewards = t([1.0, 0.0, 0.5, 0.0, 0.5, 0.0])
    gidx = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = t([1.2, -0.8, 0.4, -0.8, 0.7, -0.7])
    # R_max = 1 (the attainable maximum): index 0 reaches it: Â = α = 3; 0.4 > 0 -> 3 × 0.4 = 1.2;
    # negatives unchanged. Group 1's best (0.5) does not reach R_max: 0.7 -> 2.1; −0.7 unchanged
    out = positive_amplification(rewards, adv, gidx)
    torch.testing.assert_close(out, t([3.0, -0.8, 1.2, -0.8, 2.1, -0.7]))
    # authors' code: Â = 1.0 at the max
    out = positive_amplification(rewards, adv, gidx, max_reward_advantage=1.0)
    torch.testing.assert_close(out, t([1.0, -0.8, 1.2, -0.8, 2.1, -0.7]))
    # with R_max = 0.5 (a reward scale whose maximum is 0.5) every 0.5 reaches it too, in either group
    out = positive_amplification(rewards, adv, gidx, max_reward=0.5)
    torch.testing.assert_close(out, t([3.0, -0.8, 3.0, -0.8, 3.0, -0.7]))


def test_positive_amplification_all_correct_group():
    # all rewards = R_max = 1: every member takes the max branch (A was 0)
    out = positive_amplification(t([1.0, 1.0]), t([0.0, 0.0]), torch.tensor([0, 0]), max_reward_advantage=1.0)
    torch.testing.assert_close(out, t([1.0, 1.0]))


def test_clamp_negative_and_pipeline():
    # max(A, −0.1): [−0.5, −0.05, 0.3] -> [−0.1, −0.05, 0.3]
    out = clamp_negative(t([0.0, 0.0, 1.0]), t([-0.5, -0.05, 0.3]), torch.tensor([0, 0, 0]))
    torch.testing.assert_close(out, t([-0.1, -0.05, 0.3]))
    assert set(ADVANTAGE_TRANSFORMS) >= {"positive_amplification", "clamp_negative"}
    # pipeline on [N_groups, G]: rewards [[1, 0, 0, 1]] -> A = ±0.866024 (above)
    #   amplification (α = 3, max branch -> 1.0): [1, −0.866, −0.866, 1]; clamp -> [1, −0.1, −0.1, 1]
    rewards = t([[1.0, 0.0, 0.0, 1.0]])
    adv = group_advantages(rewards)
    chain = [make_transform("positive_amplification", max_reward_advantage=1.0), make_transform("clamp_negative")]
    out = apply_advantage_transforms(rewards, adv, None, chain)
    torch.testing.assert_close(out, t([[1.0, -0.1, -0.1, 1.0]]))
    with pytest.raises(KeyError):
        make_transform("nope")
