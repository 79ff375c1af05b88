"""GRPO-λ: eligibility traces for token credit (GRPO-lambda.md; METHODS.md §4).

Notation: ``d_j = log π_θ(a_j) − log π_old(a_j)`` on valid tokens (0 elsewhere), ``c = γλ``,
trace floor ``ε`` (``trace_floor``; not the clip ε), positions ``t, j`` are tensor columns
(responses right-padded, first response token at column 0).

Trace matrix (App. A.3, Eq. 17/18; lower-triangular, diagonal 1), for ``j < t``:
    recent: W[t, j] = max(ε, c^{t−j})
    both:   W[t, j] = max(ε, c^{t−j}, c^{j})

ε-trace (default, Sec. 3 Eq. 1 and Sec. 3.2 Eq. 2, Algorithm 1): the traced log-ratio goes inside the PPO clip
    ρ_t = exp(S_t),   S_t = Σ_{j≤t} W[t, j] d_j
    ℓ_t = −min(ρ_t Â, clip(ρ_t, 1−ε_low, 1+ε_high) Â),   Â = max(A, −0.1)

ε-weight (Sec. 3.2 "Traces as per-token weighting", App. A.3): the plain token surrogate weighted
by a trace of soft-clamped log-probabilities
    w_t = Σ_{j≤t} W[t, j] f(log π_θ(a_j)),   f(x) = 1 + σ(x − 1)
    ℓ_t = −w_t · min(r_t Â, clip(r_t, 1−ε_low, 1+ε_high) Â),   r_t = exp(d_t)
(Algorithm 2's body is missing from our copy of the paper; this reading is argued in docs/losses.md.)

Total: ``agg(ℓ) + β · agg(k3 KL to π_ref)`` (Algorithm 1, last line), β = 0.04.

The paper builds W as a T×T matrix. ``trace_sum`` computes ``S = W d`` in O(T) per sequence
without it (derivation in ``trace_sum``'s docstring and docs/losses.md); ``trace_sum_dense``
is the paper's form, kept for tests and the benchmark.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import Field

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)
from reflexdb.trainer.losses import params as P
from reflexdb.trainer.losses.common import (
    AggMode,
    aggregate,
    as_bool_mask,
    broadcast_advantages,
    clip_stats,
    clipped_surrogate,
    kl_term,
    masked_log_ratio,
    masked_mean,
)
from reflexdb.trainer.losses.registry import LossSpec
from reflexdb.trainer.losses.signals import TokenSignals, token_signals

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor

TraceStyle = Literal["recent", "both"]
UpdateStyle = Literal["trace", "weight"]

# Block length of the discounted cumsum: c^{-(L-1)} <= 2^20, far from overflow in float32 and
# float64 alike, so the in-block rescaling never produces inf and keeps float32 precision.
_LOG_MAX_RESCALE = 20.0 * math.log(2.0)


class GRPOLambdaOutput(NamedTuple):
    """Result of ``grpo_lambda_loss``. Scalars; only ``loss`` has a graph.

    Attributes:
        loss: ``policy_loss + beta * kl``, with grad.
        policy_loss: aggregated GRPO-λ surrogate (detached).
        kl: aggregated k3 KL(π_θ || π_ref) (detached).
        clip_frac: share of valid tokens whose clipped branch is active.
        approx_kl: k3 KL(π_old || π_θ) from the plain per-token ratio (not the traced one).
        ratio_mean: mean over valid tokens of the ratio inside the clip (traced ρ_t for ε-trace,
            plain r_t for ε-weight).
        ratio_max: max of that ratio.
        num_tokens: number of valid tokens.
        trace_mean: mean over valid tokens of S_t (ε-trace) or of the weight w_t (ε-weight).
        adv_clamped_frac: share of advantages raised by the clamp ``max(A, min_advantage)``.
    """

    loss: Tensor
    policy_loss: Tensor
    kl: Tensor
    clip_frac: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    num_tokens: Tensor
    trace_mean: Tensor
    adv_clamped_frac: Tensor


def _check_trace_args(lam: float, gamma: float, floor: float, style: str) -> float:
    if not (0.0 <= lam <= 1.0 and 0.0 <= gamma <= 1.0):
        raise ValueError(f"need 0 <= lam, gamma <= 1, got lam={lam}, gamma={gamma}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"trace_floor must be in [0, 1], got {floor}")
    if style not in ("recent", "both"):
        raise ValueError(f"trace_style must be 'recent' or 'both', got {style!r}")
    return gamma * lam


def trace_matrix(
    T: int,
    *,
    lam: float,
    gamma: float = 1.0,
    style: TraceStyle = "recent",
    floor: float = 0.0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """The paper's trace matrix W ``[T, T]`` (App. A.3 Eq. 17 ``both``, Eq. 18 ``recent``), in
    ``dtype`` (default float64).

    Lower-triangular, ones on the diagonal; below it ``max(ε, c^{t−j})`` (recent) or
    ``max(ε, c^{t−j}, c^{j})`` (both), ``c = γλ``. The appendix writes the recent exponent as
    "max(cols) − cols" and the both exponent as "n − cols"; we read both as the lag ``t − j`` (row
    minus column), as in Eq. 1/2 and METHODS.md §4.
    """
    c = _check_trace_args(lam, gamma, floor, style)
    dtype = dtype or torch.float64
    t = torch.arange(T, device=device)[:, None]  # [T, 1]
    j = torch.arange(T, device=device)[None, :]  # [1, T]
    base = torch.tensor(c, dtype=dtype, device=device)
    w = base.pow((t - j).clamp(min=0).to(dtype))  # [T, T]  c^{t−j}
    if style == "both":
        w = torch.maximum(w, base.pow(j.to(dtype)))  # Eq. 17: max(c^{t−j}, c^{j})
    w = w.clamp(min=floor)  # Eq. 17/18: max(ε, ·)
    w = torch.where(j < t, w, torch.zeros((), dtype=dtype, device=device))  # lower triangle
    return w + torch.eye(T, dtype=dtype, device=device)  # diagonal 1


def trace_sum_dense(
    x: Tensor,
    *,
    lam: float,
    gamma: float = 1.0,
    style: TraceStyle = "recent",
    floor: float = 0.0,
    weights: Tensor | None = None,
) -> Tensor:
    """Reference O(T²): ``S[b, t] = Σ_j W[t, j] x[b, j]`` with the dense trace matrix.

    Args:
        x: ``[B, T]`` (zero where masked).
        weights: a precomputed ``trace_matrix`` (the paper precomputes it once for max_length);
            built here when ``None``.
    """
    if weights is None:
        weights = trace_matrix(
            x.shape[-1], lam=lam, gamma=gamma, style=style, floor=floor, dtype=x.dtype, device=x.device
        )
    return x @ weights.T  # [B, T]


def discounted_cumsum(x: Tensor, c: float) -> Tensor:
    """``F_t = Σ_{k=0}^{t} c^k x_{t−k}`` along the last dim, i.e. ``F_t = c F_{t−1} + x_t``, in O(T).

    Blocked so that nothing overflows or is lost to underflow of a global ``c^{−t}`` factor:

    1. In each block of length ``L`` (``c^{−(L−1)} ≤ 2^20``) the local filter is
       ``G_i = c^i · cumsum_i(c^{−i} x_i)`` — exact algebra, rescale bounded by 2^20.
    2. The value at each block end obeys ``H_m = G_{m, L−1} + c^L H_{m−1}``; solved by a doubling
       scan over the ``n = ⌈T/L⌉`` block ends (it stops once ``(c^L)^{2^k}`` underflows to 0, after
       at most 6 steps since ``c^L ≤ 2^{−20}`` whenever there is more than one block).
    3. ``F_{m, i} = G_{m, i} + c^{i+1} H_{m−1}``.

    Differentiable (only cumsum, products, pads). ``c`` in [0, 1].
    """
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()  # the in-block rescaling (up to 2^20) needs float32 range and precision
    if c == 0.0:
        return x
    if c == 1.0:
        return x.cumsum(-1)
    T = x.shape[-1]
    if T == 0:
        return x
    L = max(1, min(T, 1 + int(_LOG_MAX_RESCALE / -math.log(c))))  # block length
    n = -(-T // L)  # number of blocks
    lead = x.shape[:-1]
    xb = torch.nn.functional.pad(x, (0, n * L - T)).reshape(*lead, n, L)  # [..., n, L]
    i = torch.arange(L, dtype=torch.float64, device=x.device)
    up = torch.pow(c, -i).to(x.dtype)  # [L]  c^{−i}
    down = torch.pow(c, i).to(x.dtype)  # [L]  c^{i}
    G = down * torch.cumsum(xb * up, dim=-1)  # [..., n, L]  Σ_{i'≤i} c^{i−i'} x_{i'} within the block
    if n > 1:
        H = _geometric_scan(G[..., -1], c**L)  # [..., n]  F at each block end
        carry = torch.nn.functional.pad(H[..., :-1], (1, 0))  # [..., n]  F at the previous block's end (0 for block 0)
        G = G + torch.pow(c, i + 1).to(x.dtype) * carry[..., None]  # [..., n, L]
    return G.reshape(*lead, n * L)[..., :T]


def _geometric_scan(g: Tensor, q: float) -> Tensor:
    """``H_m = Σ_{m'≤m} q^{m−m'} g_{m'}`` along the last dim by doubling (Hillis–Steele)."""
    n = g.shape[-1]
    H, shift, qs = g, 1, q
    while shift < n and qs > 0.0:
        H = H + qs * torch.nn.functional.pad(H[..., :-shift], (shift, 0))  # adds lags [shift, 2·shift)
        shift, qs = 2 * shift, qs * qs
    return H


def _crossover_lag(c: float, floor: float, T: int) -> int:
    """``K``: the smallest lag ``k ≥ 1`` with ``c^k ≤ ε`` (from there on the weight is the floor ε);
    ``T`` when no lag inside the sequence reaches the floor (or there is no floor)."""
    if floor <= 0.0 or T <= 1:
        return T
    if c >= 1.0:
        return 1 if floor >= 1.0 else T
    if c == 0.0:
        return 1
    k = max(1, math.ceil(math.log(floor) / math.log(c)))
    while k > 1 and c ** (k - 1) <= floor:  # repair float error of the log estimate
        k -= 1
    while c**k > floor:
        k += 1
    return min(k, T)


def trace_sum(
    x: Tensor,
    *,
    lam: float,
    gamma: float = 1.0,
    style: TraceStyle = "recent",
    floor: float = 0.0,
) -> Tensor:
    """``S[b, t] = Σ_{j≤t} W[t, j] x[b, j]`` for the trace matrix W, in O(T) per sequence.

    Equal to ``trace_sum_dense`` up to rounding, for any ``x`` (gradients too: it is built from
    differentiable ops). With ``c = γλ``, ``F`` the discounted cumsum (``F_t = Σ_k c^k x_{t−k}``),
    ``P`` the plain prefix sum, ``K`` the crossover lag (``c^k > ε`` for ``k < K``, ``≤ ε`` after):

    Recent part, lags ``0..M_t`` (``M_t = t`` for recent; ``⌊t/2⌋`` for both, where
    ``c^{t−j} ≥ c^{j}`` exactly when ``j ≥ t/2``), weight ``max(ε, c^k)``:
        Σ_{k=0}^{M_t} max(ε, c^k) x_{t−k}
          = [F_t − c^{m_t+1} F_{t−m_t−1}]          m_t = min(M_t, K−1): exponential lags 0..m_t
          + ε [P_{t−K} − P_{t−M_t−1}]   if M_t ≥ K: lags K..M_t at the floor
    (``F_{−1} = P_{−1} = 0``.) The subtraction never multiplies by ``c^{−t}`` — ``c^{m+1} ≤ 1`` and
    ``|F| ≤ max|x|/(1−c)`` — so nothing overflows; an underflowing ``c^{m+1}`` is the true
    (negligible) weight.
    Early part (both only), columns ``j < ⌈t/2⌉``, weight ``max(ε, c^j)`` depends on ``j`` alone:
        Q_{⌈t/2⌉−1},   Q = cumsum(max(ε, c^j) x_j).

    Args:
        x: ``[..., T]``, zero where masked. float16/bfloat16 are computed (and returned) in float32.
        lam, gamma: λ and γ; ``c = γλ``.
        style: ``recent`` or ``both``.
        floor: trace floor ε in [0, 1].
    """
    c = _check_trace_args(lam, gamma, floor, style)
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()  # the in-block rescaling (up to 2^20) needs float32 range and precision
    T = x.shape[-1]
    dev, dt = x.device, x.dtype
    t = torch.arange(T, device=dev)  # [T]
    max_lag = t if style == "recent" else t // 2  # [T]  M_t
    K = _crossover_lag(c, floor, T)
    Fx = discounted_cumsum(x, c)  # [..., T]
    if style == "recent" and K >= T:
        return Fx  # no floor inside the sequence: S_t = F_t (Eq. 1; the subtracted term is c^{t+1} F_{−1} = 0)
    m = torch.clamp(max_lag, max=K - 1)  # [T]  last exponential lag
    F_pad = torch.nn.functional.pad(Fx, (1, 0))  # [..., T+1]  F_pad[..., i+1] = F_i, F_pad[..., 0] = F_{−1} = 0
    coef = torch.pow(torch.tensor(c, dtype=torch.float64, device=dev), (m + 1).to(torch.float64)).to(dt)  # [T]
    S = Fx - coef * F_pad.index_select(-1, t - m)  # [..., T]  exponential lags 0..m_t (Eq. 1 for recent, ε = 0)
    if K < T:  # some lags sit on the floor (Eq. 17/18: max(ε, ·))
        P_pad = torch.nn.functional.pad(x.cumsum(-1), (1, 0))  # [..., T+1]  P_pad[..., i+1] = P_i
        on_floor = max_lag >= K  # [T]
        hi = torch.clamp(t - K + 1, min=0)  # index of P_{t−K}
        lo = t - max_lag  # index of P_{t−M_t−1}
        tail = P_pad.index_select(-1, hi) - P_pad.index_select(-1, lo)  # [..., T]
        tail = torch.where(on_floor, tail, torch.zeros((), dtype=dt, device=dev))
        S = S + floor * tail  # [..., T]
    if style == "both":
        j = torch.arange(T, dtype=torch.float64, device=dev)
        w_early = torch.pow(c, j).clamp(min=floor).to(dt)  # [T]  Eq. 17: max(ε, c^j)
        Q_pad = torch.nn.functional.pad(torch.cumsum(w_early * x, dim=-1), (1, 0))  # [..., T+1]
        S = S + Q_pad.index_select(-1, t - max_lag)  # Q_{⌈t/2⌉−1}: columns j < ⌈t/2⌉
    return S


def soft_clamp(logprobs: Tensor) -> Tensor:
    """App. A.3 soft clamp of log-probabilities for the ε-weight traces: ``1 + σ(log π − 1)``."""
    return 1.0 + torch.sigmoid(logprobs - 1.0)


class LambdaTokens(NamedTuple):
    """GRPO-λ's per-token pieces (``lambda_tokens``), ``[B, T]`` (advantages ``[B, 1]`` or ``[B, T]``)."""

    log_ratio: Tensor  # d_j: log π_θ − log π_old on the mask, 0 elsewhere
    ratio: Tensor  # the ratio inside the clip: exp(S_t) (ε-trace), r_t = exp(d_t) (ε-weight)
    adv_raw: Tensor  # A as given, broadcast
    adv: Tensor  # Â = max(A, min_advantage)
    token_loss: Tensor  # ℓ_t
    clipped: Tensor  # bool: the clipped branch is the active one
    trace: Tensor  # S_t (ε-trace) or the weight w_t (ε-weight)


def lambda_tokens(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    lam: float,
    gamma: float,
    trace_style: TraceStyle,
    trace_floor: float,
    update_style: UpdateStyle,
    weight_grad: bool,
    clip_eps_low: float,
    clip_eps_high: float,
    min_advantage: float | None,
) -> LambdaTokens:
    """The per-token surrogate of ``grpo_lambda_loss`` (the module docstring's ε-trace and
    ε-weight), shared by the loss and its signals; ``mask`` bool."""
    if update_style not in ("trace", "weight"):
        raise ValueError(f"update_style must be 'trace' or 'weight', got {update_style!r}")
    trace_kw = dict(lam=lam, gamma=gamma, style=trace_style, floor=trace_floor)
    log_ratio = masked_log_ratio(logprobs, old_logprobs, mask)  # [B, T]  d_j
    adv_raw = broadcast_advantages(advantages, log_ratio)  # [B, 1]
    adv = adv_raw if min_advantage is None else adv_raw.clamp(min=min_advantage)  # Alg. 1: Â = max(A, −0.1)
    if update_style == "trace":
        traced = trace_sum(log_ratio, **trace_kw)  # [B, T]  Σ_{j≤t} W[t, j] d_j  (Eq. 1/2)
        ratio = torch.exp(traced)  # [B, T]  π_ratio^GAE(s_t)  (Eq. 1/2)
        token_loss, clipped = clipped_surrogate(ratio, adv, clip_eps_low, clip_eps_high)  # Alg. 1: −min(ρ Â, clip(ρ) Â)
        trace_stat = traced
    else:
        ratio = torch.exp(log_ratio)  # [B, T]  plain token ratio
        source = logprobs if weight_grad else logprobs.detach()
        f = torch.where(mask, soft_clamp(source), torch.zeros((), dtype=log_ratio.dtype))  # [B, T]  App. A.3: 1 + σ(log π − 1)
        weights = trace_sum(f, **trace_kw)  # [B, T]  ε^w_t = Σ_{j≤t} W[t, j] f(log π_j)
        surrogate, clipped = clipped_surrogate(ratio, adv, clip_eps_low, clip_eps_high)  # [B, T]  δ^V from the PPO clip
        token_loss = weights * surrogate  # [B, T]  Sec. 3.2: weight ℓ_NAE(s_t) by its trace
        trace_stat = weights
    return LambdaTokens(log_ratio, ratio, adv_raw, adv, token_loss, clipped, trace_stat)


def grpo_lambda_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.04,
    lam: float = 0.99,
    gamma: float = 1.0,
    trace_style: TraceStyle = "recent",
    trace_floor: float = 0.0,
    update_style: UpdateStyle = "trace",
    weight_grad: bool = False,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    min_advantage: float | None = -0.1,
    agg: AggMode = "seq-mean-token-mean",
    max_len: int | None = None,
) -> GRPOLambdaOutput:
    """GRPO-λ loss, ε-trace (default) or ε-weight, traces in O(T).

    Args:
        logprobs: ``log π_θ`` ``[B, T]`` (with grad).
        old_logprobs: ``log π_old`` ``[B, T]``.
        advantages: ``[B]`` group-normalised advantages (A_NAE; or ``[B, T]``).
        mask: valid tokens ``[B, T]``; masked positions have ``d = 0`` and no loss.
        ref_logprobs: ``log π_ref`` ``[B, T]``; required since ``beta`` defaults to 0.04.
        beta: KL coefficient (paper App. B: 0.04).
        lam, gamma: λ (0.99) and γ (1.0); the trace decays with ``c = γλ``.
        trace_style: ``recent`` (classic trace) or ``both`` (Eq. 2).
        trace_floor: ε of Eq. 17/18, in [0, 1]. The paper gives no value; 0 disables it.
        update_style: ``trace`` (ε-trace, Algorithm 1) or ``weight`` (ε-weight, Algorithm 2).
        weight_grad: ε-weight only. ``False``: the weights are constants (``log π_θ`` detached;
            "the trace only needs to be computed once", Sec. 3.2). ``True``: the gradient also
            flows through ``f(log π_θ)`` in the weights (the other reading of App. A.3).
        clip_eps_low, clip_eps_high: PPO clip (GRPO's ε = 0.2 both sides).
        min_advantage: the negative-advantage clamp ``Â = max(A, −0.1)`` (Algorithm 1, Sec. 4.2);
            ``None`` disables it.
        agg: aggregation (GRPO's ``seq-mean-token-mean``; the paper builds on TRL's GRPO).
        max_len: only for ``seq-mean-token-sum-norm``.

    Returns:
        ``GRPOLambdaOutput``. With ``lam=0`` (or ``gamma=0``), ``trace_style="recent"``,
        ``trace_floor=0`` and ``update_style="trace"`` the loss and its gradient equal
        ``grpo_loss`` exactly (tested).
    """
    mask = as_bool_mask(mask)
    log_ratio, ratio, adv_raw, adv, token_loss, clipped, trace_stat = lambda_tokens(
        logprobs, old_logprobs, advantages, mask, lam=lam, gamma=gamma, trace_style=trace_style,
        trace_floor=trace_floor, update_style=update_style, weight_grad=weight_grad, clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high, min_advantage=min_advantage)
    policy_loss = aggregate(token_loss, mask, agg, max_len=max_len)
    kl = kl_term(logprobs, ref_logprobs, mask, beta, agg, max_len)
    loss = policy_loss + beta * kl  # Alg. 1: ℓ + β · ℓ_KL
    stats = clip_stats(ratio, clipped, mask, log_ratio, mask)  # per token, over valid tokens
    return GRPOLambdaOutput(
        loss=loss,
        policy_loss=policy_loss.detach(),
        kl=kl.detach(),
        **stats._asdict(),
        trace_mean=masked_mean(trace_stat.detach(), mask),
        adv_clamped_frac=(adv_raw < adv).float().mean(),
    )


def grpo_lambda_signals(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    lam: float = 0.99,
    gamma: float = 1.0,
    trace_style: TraceStyle = "recent",
    trace_floor: float = 0.0,
    update_style: UpdateStyle = "trace",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    min_advantage: float | None = -0.1,
) -> TokenSignals:
    """What ``grpo_lambda_loss`` used per token (reflexdb.trainer.losses.signals): ε-trace: the
    clamped advantage Â, the traced log-ratio S_t (``log ρ_t``, the ratio inside the clip) and its
    clip; ε-weight: the per-token advantage ``w_t · Â`` (``ℓ_t = −w_t min(r_t Â, clip(r_t) Â)
    = −min(r_t w_t Â, clip(r_t) w_t Â)``, the weights being positive), the plain log-ratio and its clip."""
    with torch.no_grad():
        mask = as_bool_mask(mask)
        parts = lambda_tokens(logprobs.detach(), old_logprobs, advantages, mask, lam=lam, gamma=gamma,
                              trace_style=trace_style, trace_floor=trace_floor, update_style=update_style,
                              weight_grad=False, clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high,
                              min_advantage=min_advantage)
        if update_style == "trace":
            return token_signals(mask, advantage=parts.adv, log_ratio=parts.trace, clipped=parts.clipped)
        return token_signals(mask, advantage=parts.trace * parts.adv, log_ratio=parts.log_ratio,
                             clipped=parts.clipped)


class GRPOLambdaParams(P.LossParams):
    """``grpo_lambda_loss``'s parameters (GRPO-lambda.md App. B defaults)."""

    lam: float = Field(0.99, ge=0.0, le=1.0, description="GRPO-λ: λ of the eligibility trace.")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="GRPO-λ: discount γ.")
    trace_style: TraceStyle = Field("recent", description="GRPO-λ: trace weights (App. A.3): recent (classic "
                                                          "trace) or both (Eq. 2).")
    trace_floor: float = Field(0.0, ge=0.0, le=1.0, description="GRPO-λ: trace floor ε (0 disables it).")
    update_style: UpdateStyle = Field("trace", description="GRPO-λ: ε-trace (ratio of traced log-ratios) or "
                                                           "ε-weight (traces weight the surrogate).")
    weight_grad: bool = Field(False, description="GRPO-λ ε-weight only: let the gradient flow through the "
                                                 "trace weights too (the other reading of App. A.3).")
    min_advantage: float | None = Field(-0.1, le=0.0, description="GRPO-λ: negative-advantage clamp "
                                                                  "max(A, min_advantage); null disables it.")
    beta: float = P.beta(0.04)
    clip_eps_low: float = P.clip_eps_low(0.2)
    clip_eps_high: float = P.clip_eps_high(0.2)
    agg: P.AggName = P.agg("seq-mean-token-mean")
    max_len: int | None = P.max_len()


SPEC = LossSpec("grpo_lambda", grpo_lambda_loss, GRPOLambdaParams, signals=grpo_lambda_signals)
