"""OPMD / REINFORCE-style policy gradient: ``−A · log π_θ``, no ratio, no clip (METHODS.md §0).

R3L's RL loss (R3L.md Eq. 12 and Algorithm 1 line 38) is this with the pivotal mask folded into
``mask``, amplified advantages (``advantages.positive_amplification``) and
``seq-mean-token-mean`` aggregation:

    L = −1/|G| Σ_τ 1/|τ| Σ_{k,t} M[k] · Â_τ · log π_θ(y_k^t | h_k, y_k^{<t})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)

from . import params as P
from .common import (
    AggMode,
    aggregate,
    as_bool_mask,
    broadcast_advantages,
    kl_term,
    masked_log_ratio,
    policy_ratio_stats,
)
from .signals import TokenSignals, token_signals

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


class PGLossOutput(NamedTuple):
    """Result of a ratio-free policy-gradient loss.

    Attributes:
        loss: ``policy_loss + beta * kl``, with grad.
        policy_loss: aggregated ``−A·log π_θ`` (detached).
        kl: aggregated k3 KL(π_θ || π_ref) (detached; 0 without a reference).
        approx_kl: k3 KL(π_old || π_θ) over valid tokens — how far the data's policy is (a metric
            only: the loss has no ratio).
        num_tokens: number of valid tokens.
    """

    loss: Tensor
    policy_loss: Tensor
    kl: Tensor
    approx_kl: Tensor
    num_tokens: Tensor


def opmd_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    agg: AggMode = "seq-mean-token-mean",
    max_len: int | None = None,
) -> PGLossOutput:
    """REINFORCE-style loss ``agg(−A · log π_θ)``.

    Args:
        logprobs: ``log π_θ`` ``[B, T]`` (with grad).
        old_logprobs: behaviour logprobs ``[B, T]``; used only for the ``approx_kl`` metric.
        advantages: ``[B]`` (or ``[B, T]``).
        mask: valid tokens ``[B, T]`` (R3L: pivotal mask applied).
        ref_logprobs, beta: optional k3 KL term (R3L uses none).
        agg: aggregation mode; R3L's Eq. 12 is ``seq-mean-token-mean``.
        max_len: only for ``seq-mean-token-sum-norm``.
    """
    mask = as_bool_mask(mask)
    lp = torch.where(mask, logprobs, torch.zeros((), dtype=logprobs.dtype))  # [B, T]
    adv = broadcast_advantages(advantages, lp)  # [B, 1]
    token_loss = -adv * lp  # [B, T]  R3L Eq. 12: −Â · log π_θ
    policy_loss = aggregate(token_loss, mask, agg, max_len=max_len)  # 1/|G| Σ_τ 1/|τ| Σ_t
    kl = kl_term(logprobs, ref_logprobs, mask, beta, agg, max_len)
    with torch.no_grad():
        approx_kl, num_tokens = policy_ratio_stats(masked_log_ratio(logprobs.detach(), old_logprobs, mask), mask)
    return PGLossOutput(
        loss=policy_loss + beta * kl,
        policy_loss=policy_loss.detach(),
        kl=kl.detach(),
        approx_kl=approx_kl,
        num_tokens=num_tokens,
    )


def opmd_signals(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> TokenSignals:
    """What ``opmd_loss`` used per token: A_i; no clip (never clipped). The log-ratio
    log π_θ − log π_old is recorded as the metric ``approx_kl`` reads it: the loss itself has no
    ratio."""
    with torch.no_grad():
        mask = as_bool_mask(mask)
        adv = broadcast_advantages(advantages, logprobs)  # [B, 1]
        return token_signals(mask, advantage=adv, log_ratio=masked_log_ratio(logprobs.detach(), old_logprobs, mask))


class OPMDParams(P.LossParams):
    """``opmd_loss``'s parameters (no ratio, so no clip)."""

    beta: float = P.beta(0.0)
    agg: P.AggName = P.agg("seq-mean-token-mean")
    max_len: int | None = P.max_len()
