"""GRPO-λ: trace matrix by hand, O(T) trace == dense T×T form (values and gradients), λ = 0 is
GRPO, ε-trace and ε-weight by hand (arithmetic in the comments)."""

from __future__ import annotations

import math
import zlib

import pytest
import torch
from reflexdb.methods.grpo_lambda.loss import (
    discounted_cumsum,
    grpo_lambda_loss,
    trace_matrix,
    trace_sum,
    trace_sum_dense,
)
from reflexdb.trainer.losses import grpo_loss
from reflexdb.trainer.losses.common import aggregate, k3_kl

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


# ---------------------------------------------------------------- the trace matrix


def test_trace_matrix_by_hand():
    # c = γλ = 0.5, floor ε = 0.2, T = 4. Lag weights max(ε, c^k): k=1: 0.5, k=2: 0.25, k=3: max(0.2, 0.125) = 0.2
    recent = t([[1, 0, 0, 0], [0.5, 1, 0, 0], [0.25, 0.5, 1, 0], [0.2, 0.25, 0.5, 1]])
    torch.testing.assert_close(trace_matrix(4, lam=0.5, style="recent", floor=0.2), recent)
    # both: W[t, j] = max(ε, c^{t−j}, c^j) below the diagonal
    #   t=1: j=0: max(.2, .5, 1) = 1
    #   t=2: j=0: 1; j=1: max(.2, .25, .5) = .5
    #   t=3: j=0: 1; j=1: max(.2, .25, .5) = .5; j=2: max(.2, .5, .25) = .5
    both = t([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0.5, 1, 0], [1, 0.5, 0.5, 1]])
    torch.testing.assert_close(trace_matrix(4, lam=0.5, style="both", floor=0.2), both)
    # γ enters as c = γλ: γ = 0.5, λ = 1 is the same matrix
    torch.testing.assert_close(trace_matrix(4, lam=1.0, gamma=0.5, style="recent", floor=0.2), recent)


def test_trace_args_validated():
    x = torch.zeros(1, 3, dtype=D)
    for kw in ({"lam": 1.5}, {"lam": 0.9, "floor": -0.1}, {"lam": 0.9, "floor": 2.0}, {"lam": 0.9, "style": "old"}):
        with pytest.raises(ValueError):
            trace_sum(x, **kw)


# ---------------------------------------------------------------- O(T) == dense


def _random_masked(B, T, gen):
    """Random log-ratios, masked with right padding and some holes, masked positions exactly 0."""
    x = torch.randn(B, T, dtype=D, generator=gen)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask &= torch.rand(B, T, generator=gen) > 0.1
    return torch.where(mask, x, 0.0), mask


@pytest.mark.parametrize("style", ["recent", "both"])
@pytest.mark.parametrize("floor", [0.0, 1e-3, 0.05, 0.3])
@pytest.mark.parametrize(
    "lam,gamma", [(0.99, 1.0), (0.98, 0.99), (0.9, 1.0), (0.5, 1.0), (0.2, 1.0), (0.0, 1.0), (1.0, 1.0)]
)
def test_trace_sum_equals_dense(style, floor, lam, gamma):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((style, floor, lam, gamma)).encode()))
    for T in (1, 2, 3, 17, 128, 300):
        x, _ = _random_masked(4, T, gen)
        fast = trace_sum(x, lam=lam, gamma=gamma, style=style, floor=floor)
        dense = trace_sum_dense(x, lam=lam, gamma=gamma, style=style, floor=floor)
        torch.testing.assert_close(fast, dense, rtol=0, atol=1e-9, msg=f"T={T}")


@pytest.mark.parametrize("style", ["recent", "both"])
@pytest.mark.parametrize("floor", [0.0, 0.01])
def test_trace_sum_equals_dense_many_blocks(style, floor):
    # c = 0.9: the discounted cumsum works in blocks of 132 (0.9^-131 ≤ 2^20), so T = 1200 spans
    # 10 blocks, and carries from two blocks back (weight ≤ 0.9^132 ≈ 1e-6, above this tolerance)
    # are needed; the floor 0.01 is reached at lag 44 (0.9^44 = 0.0097).
    gen = torch.Generator().manual_seed(1)
    x, _ = _random_masked(3, 1200, gen)
    fast = trace_sum(x, lam=0.9, style=style, floor=floor)
    dense = trace_sum_dense(x, lam=0.9, style=style, floor=floor)
    torch.testing.assert_close(fast, dense, rtol=0, atol=1e-9)


@pytest.mark.parametrize("c", [0.999, 0.99, 0.9, 0.5, 0.05])
def test_discounted_cumsum_equals_recurrence(c):
    # F_t = c F_{t−1} + x_t (Eq. 15's recursion) over 20 000 steps: many blocks for every c
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 20_000, dtype=D, generator=gen)
    expected = torch.empty_like(x)
    acc = torch.zeros(2, dtype=D)
    for i in range(x.shape[1]):
        acc = c * acc + x[:, i]
        expected[:, i] = acc
    torch.testing.assert_close(discounted_cumsum(x, c), expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("style", ["recent", "both"])
@pytest.mark.parametrize("floor", [0.0, 0.05])
@pytest.mark.parametrize("lam", [0.99, 0.7, 0.0])
def test_trace_sum_gradient_equals_dense(style, floor, lam):
    gen = torch.Generator().manual_seed(3)
    x, _ = _random_masked(3, 257, gen)
    cotangent = torch.randn(3, 257, dtype=D, generator=gen)
    grads = []
    for fn in (trace_sum, trace_sum_dense):
        xg = x.clone().requires_grad_()
        (fn(xg, lam=lam, style=style, floor=floor) * cotangent).sum().backward()
        grads.append(xg.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-9)


def test_trace_sum_long_sequence_without_dense():
    # T = 200 000 would need a 320 GB float64 matrix; the O(T) form runs in milliseconds.
    # Check against the recurrence S_t = c S_{t−1} + d_t (recent, ε = 0) at a few positions.
    x = torch.randn(1, 200_000, dtype=D, generator=torch.Generator().manual_seed(4))
    s = trace_sum(x, lam=0.99)
    acc, xs = 0.0, x[0].tolist()
    for i, v in enumerate(xs):
        acc = 0.99 * acc + v
        if i in (0, 1379, 1380, 99_999, 199_999):  # 1380: first position of the second block
            assert s[0, i].item() == pytest.approx(acc, abs=1e-9)


def test_half_precision_is_computed_in_float32():
    x = torch.randn(2, 50, dtype=D, generator=torch.Generator().manual_seed(5))
    out = trace_sum(x.to(torch.bfloat16), lam=0.99, style="both", floor=0.01)
    assert out.dtype == torch.float32
    dense = trace_sum_dense(x.to(torch.bfloat16).double(), lam=0.99, style="both", floor=0.01)
    torch.testing.assert_close(out.double(), dense, rtol=0, atol=1e-4)


# ---------------------------------------------------------------- the loss vs Algorithm 1 (dense)


def _algorithm1_dense(lp, old, adv, mask, ref, *, lam, style, floor, beta, clip=0.2, min_adv=-0.1):
    """Algorithm 1 written with the paper's dense trace matrix (independent of trace_sum)."""
    W = trace_matrix(lp.shape[1], lam=lam, style=style, floor=floor)
    d = torch.where(mask, lp - old, 0.0)
    coef_1 = torch.exp(d @ W.T)
    a_hat = adv.clamp(min=min_adv)[:, None]
    per_token = -torch.minimum(coef_1 * a_hat, coef_1.clamp(1 - clip, 1 + clip) * a_hat)
    loss = aggregate(per_token, mask, "seq-mean-token-mean")
    return loss + beta * aggregate(k3_kl(lp, ref, mask), mask, "seq-mean-token-mean")


@pytest.mark.parametrize("style", ["recent", "both"])
@pytest.mark.parametrize("floor", [0.0, 0.02])
def test_loss_equals_dense_algorithm1(style, floor):
    gen = torch.Generator().manual_seed(6)
    B, T = 4, 96
    old = -torch.rand(B, T, dtype=D, generator=gen) * 3
    ref = -torch.rand(B, T, dtype=D, generator=gen) * 3
    # small policy change, so that the traced ratios straddle the clip range
    lp0 = old + 0.01 * torch.randn(B, T, dtype=D, generator=gen)
    adv = torch.randn(B, dtype=D, generator=gen)
    _, mask = _random_masked(B, T, gen)
    mask[0] = True
    results = []
    for fn in ("ours", "dense"):
        lp = lp0.clone().requires_grad_()
        if fn == "ours":
            loss = grpo_lambda_loss(lp, old, adv, mask, ref_logprobs=ref, trace_style=style, trace_floor=floor).loss
        else:
            loss = _algorithm1_dense(lp, old, adv, mask, ref, lam=0.99, style=style, floor=floor, beta=0.04)
        loss.backward()
        results.append((loss.detach(), lp.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- λ = 0 is GRPO


def _grpo_case(seed, adv_low):
    gen = torch.Generator().manual_seed(seed)
    B, T = 5, 40
    old = -torch.rand(B, T, dtype=D, generator=gen) * 3
    lp0 = old + 0.3 * torch.randn(B, T, dtype=D, generator=gen)  # ratios well outside 1 ± 0.2
    adv = adv_low + torch.rand(B, dtype=D, generator=gen) * 2
    _, mask = _random_masked(B, T, gen)
    ref = -torch.rand(B, T, dtype=D, generator=gen) * 3
    return lp0, old, adv, mask, ref


@pytest.mark.parametrize("clamp", ["disabled", "inactive"])
@pytest.mark.parametrize("zero", ["lam", "gamma"])
def test_lambda_zero_is_grpo_exactly(clamp, zero):
    # ε-trace, recent style, trace floor 0. "disabled": min_advantage=None, advantages in [−1, 1];
    # "inactive": the default clamp −0.1 with advantages in [−0.1, 1.9] (the clamp changes nothing).
    lp0, old, adv, mask, ref = _grpo_case(7, -1.0 if clamp == "disabled" else -0.1)
    kw = {"min_advantage": None} if clamp == "disabled" else {}
    decay = {"lam": 0.0} if zero == "lam" else {"lam": 0.99, "gamma": 0.0}
    lp_a, lp_b = lp0.clone().requires_grad_(), lp0.clone().requires_grad_()
    ours = grpo_lambda_loss(lp_a, old, adv, mask, ref_logprobs=ref, beta=0.04, **decay, **kw)
    grpo = grpo_loss(lp_b, old, adv, mask, ref_logprobs=ref, beta=0.04)
    assert ours.clip_frac.item() > 0  # the clip is exercised
    assert torch.equal(ours.loss, grpo.loss)
    ours.loss.backward()
    grpo.loss.backward()
    assert torch.equal(lp_a.grad, lp_b.grad)


def test_lambda_positive_differs_from_grpo():
    lp0, old, adv, mask, ref = _grpo_case(8, -1.0)
    ours = grpo_lambda_loss(lp0, old, adv, mask, ref_logprobs=ref, min_advantage=None)
    grpo = grpo_loss(lp0, old, adv, mask, ref_logprobs=ref, beta=0.04)
    assert abs(ours.loss.item() - grpo.loss.item()) > 1e-3


def test_both_style_at_lambda_zero_keeps_first_token():
    # Eq. 17 at c = 0: W[t, 0] = max(ε, 0, c^0 = 1) = 1, so S_t = d_t + d_0 for t ≥ 1 — the `both`
    # style does not reduce to GRPO at λ = 0 (only `recent` does, as the paper states for Eq. 1).
    d = t([[0.5, 0.1, -0.2, 0.3]])
    torch.testing.assert_close(trace_sum(d, lam=0.0, style="both"), t([[0.5, 0.6, 0.3, 0.8]]))


# ---------------------------------------------------------------- ε-trace and ε-weight by hand


def test_epsilon_trace_by_hand():
    # λ = 0.5 (c = 0.5), recent, ε = 0, β = 0, A = 1, old = 0, logprobs = [0.2, −0.1]:
    #   S_0 = 0.2; S_1 = 0.5 × 0.2 − 0.1 = 0.0  ->  ρ = [e^0.2 = 1.221403, 1.0]
    #   token 0: −min(1.221403, 1.2) = −1.2 (clipped); token 1: −min(1, 1) = −1  ->  loss −1.1
    #   grad: token 0 clipped -> 0 directly; token 1: −A ρ_1 ∂S_1/∂lp / 2 = [−0.5 × 0.5, −0.5] = [−0.25, −0.5]
    lp = t([[0.2, -0.1]]).requires_grad_()
    out = grpo_lambda_loss(lp, torch.zeros(1, 2, dtype=D), t([1.0]), torch.ones(1, 2, dtype=torch.bool), lam=0.5, beta=0.0)
    assert out.loss.item() == pytest.approx(-1.1)
    assert out.clip_frac.item() == pytest.approx(0.5)
    assert out.trace_mean.item() == pytest.approx(0.1)  # (0.2 + 0.0)/2
    out.loss.backward()
    torch.testing.assert_close(lp.grad, t([[-0.25, -0.5]]))
    # plain GRPO on the same tokens: ρ = [1.221403, e^−0.1 = 0.904837] -> −(1.2 + 0.904837)/2 = −1.052419
    grpo = grpo_loss(lp.detach(), torch.zeros(1, 2, dtype=D), t([1.0]), torch.ones(1, 2, dtype=torch.bool))
    assert grpo.loss.item() == pytest.approx(-(1.2 + math.exp(-0.1)) / 2)


SIG = 1 / (1 + math.e)  # σ(−1) = 0.268941
F0 = 1 + SIG  # f(0) = 1 + σ(0 − 1) = 1.268941
DF0 = SIG * (1 - SIG)  # f'(0) = σ(−1)(1 − σ(−1)) = 0.196612


def _weight_case(weight_grad):
    # λ = 0.5, recent, ε = 0, β = 0, A = 1; logprobs = [0, 0], old = [0, −log 1.5] -> r = [1, 1.5]
    lp = torch.zeros(1, 2, dtype=D, requires_grad=True)
    old = t([[0.0, -math.log(1.5)]])
    out = grpo_lambda_loss(
        lp, old, t([1.0]), torch.ones(1, 2, dtype=torch.bool),
        lam=0.5, beta=0.0, update_style="weight", weight_grad=weight_grad,
    )
    out.loss.backward()
    return out, lp.grad


def test_epsilon_weight_by_hand():
    # weights: w_0 = f(0) = 1.268941; w_1 = 0.5 f(0) + f(0) = 1.903412
    # surrogates: token 0: min(1·1, 1·1) = 1; token 1: min(1.5, 1.2) = 1.2 (clipped)
    # loss = −(w_0 × 1 + w_1 × 1.2)/2 = −(1.268941 + 2.284094)/2 = −1.776518
    out, grad = _weight_case(weight_grad=False)
    w0, w1 = F0, 1.5 * F0
    assert out.loss.item() == pytest.approx(-(w0 * 1.0 + w1 * 1.2) / 2)
    assert out.trace_mean.item() == pytest.approx((w0 + w1) / 2)
    # weights are constants: d/dlp_0 = −w_0 ρ_0 A / 2 = −0.634471; token 1 clipped -> 0
    torch.testing.assert_close(grad, t([[-w0 / 2, 0.0]]))


def test_epsilon_weight_gradient_through_weights():
    # weight_grad=True adds ∂w/∂lp: ∂w_0/∂lp_0 = f'(0), ∂w_1/∂lp_0 = 0.5 f'(0), ∂w_1/∂lp_1 = f'(0)
    #   d/dlp_0 = −(w_0 × 1 + f'(0) × 1 + 0.5 f'(0) × 1.2)/2 = −(1.268941 + 0.196612 + 0.117967)/2 = −0.791760
    #   d/dlp_1 = −(f'(0) × 1.2)/2 = −0.117967
    out, grad = _weight_case(weight_grad=True)
    assert out.loss.item() == pytest.approx(-(F0 + 1.5 * F0 * 1.2) / 2)
    torch.testing.assert_close(grad, t([[-(F0 + DF0 + 0.6 * DF0) / 2, -(DF0 * 1.2) / 2]]))


def test_negative_advantage_clamp():
    # λ = 0, one token, ρ = 1, A = −0.5 -> Â = max(−0.5, −0.1) = −0.1 -> loss −min(−0.1, −0.1) = 0.1
    lp = t([[-1.0]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    out = grpo_lambda_loss(lp, lp, t([-0.5]), mask, lam=0.0, beta=0.0)
    assert out.loss.item() == pytest.approx(0.1)
    assert out.adv_clamped_frac.item() == 1.0
    assert grpo_lambda_loss(lp, lp, t([-0.5]), mask, lam=0.0, beta=0.0, min_advantage=None).loss.item() == pytest.approx(0.5)


def test_padding_gets_no_loss_and_no_trace():
    # padding holds −inf / NaN logprobs: it must neither enter the traces (d = 0) nor the loss
    gen = torch.Generator().manual_seed(9)
    old = -torch.rand(2, 6, dtype=D, generator=gen)
    lp0 = old + 0.05 * torch.randn(2, 6, dtype=D, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 0]], dtype=torch.bool)
    dirty = lp0.clone()
    dirty[~mask] = float("-inf")
    dirty_old = old.clone()
    dirty_old[~mask] = float("nan")
    adv = t([1.0, -1.0])
    for style in ("trace", "weight"):
        lp_clean, lp_dirty = lp0.clone().requires_grad_(), dirty.clone().requires_grad_()
        clean = grpo_lambda_loss(lp_clean, old, adv, mask, update_style=style, beta=0.0, trace_style="both")
        messy = grpo_lambda_loss(lp_dirty, dirty_old, adv, mask, update_style=style, beta=0.0, trace_style="both")
        assert torch.equal(clean.loss, messy.loss)
        clean.loss.backward()
        messy.loss.backward()
        assert torch.isfinite(lp_dirty.grad).all()
        assert torch.equal(lp_dirty.grad[~mask], torch.zeros(int((~mask).sum()), dtype=D))
        torch.testing.assert_close(lp_clean.grad, lp_dirty.grad)
