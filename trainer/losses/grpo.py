"""GRPO: clipped token-level surrogate with group-normalised advantages (Shao et al., 2024,
DeepSeekMath Eq. 3), optional k3 KL to a frozen reference.

    J = 1/G Σ_i 1/|o_i| Σ_t [ min(ρ_{i,t} A_i, clip(ρ_{i,t}, 1−ε_low, 1+ε_high) A_i) − β D_KL ]
    ρ_{i,t} = π_θ(o_{i,t}) / π_old(o_{i,t})

The loss is −J. Dr.GRPO and DAPO are the same surrogate with another aggregation (and DAPO's
clip-higher and overlong filter): ``dr_grpo.py``, ``dapo.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)

from . import params as P
from .common import (
    AggMode,
    PolicyLossOutput,
    aggregate,
    as_bool_mask,
    broadcast_advantages,
    clip_stats,
    clipped_surrogate,
    kl_term,
    masked_log_ratio,
)
from .signals import TokenSignals, token_signals

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


class ClippedTokens(NamedTuple):
    """The per-token pieces of the clipped surrogate (``clipped_tokens``), ``[B, T]`` unless said."""

    log_ratio: Tensor  # log π_θ − log π_old on the mask, 0 elsewhere
    ratio: Tensor  # ρ = exp(log_ratio)
    advantages: Tensor  # A broadcast: [B, 1] (or [B, T])
    token_loss: Tensor  # −min(ρA, clip(ρ)A)
    clipped: Tensor  # bool: the clipped branch is the active one


def clipped_tokens(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   clip_eps_low: float, clip_eps_high: float) -> ClippedTokens:
    """GRPO's per-token surrogate (Eq. 3 inside the sum), shared by the loss and its signals."""
    log_ratio = masked_log_ratio(logprobs, old_logprobs, mask)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    adv = broadcast_advantages(advantages, ratio)  # [B, 1]
    token_loss, clipped = clipped_surrogate(ratio, adv, clip_eps_low, clip_eps_high)  # [B, T]  Eq. 3
    return ClippedTokens(log_ratio, ratio, adv, token_loss, clipped)


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    agg: AggMode = "seq-mean-token-mean",
    max_len: int | None = None,
) -> PolicyLossOutput:
    """GRPO clipped surrogate loss.

    Args:
        logprobs: ``log π_θ`` of the sampled tokens ``[B, T]`` (with grad).
        old_logprobs: ``log π_old`` (proximal or behaviour policy) ``[B, T]``.
        advantages: ``[B]`` per sequence (or ``[B, T]`` per token).
        mask: valid tokens ``[B, T]``.
        ref_logprobs: ``log π_ref`` ``[B, T]`` for the KL term; needed when ``beta != 0``.
        beta: KL coefficient (0 by default, METHODS.md §0).
        clip_eps_low: ε_low; the ratio is clipped at ``1 − ε_low``.
        clip_eps_high: ε_high; the ratio is clipped at ``1 + ε_high``.
        agg: aggregation mode (``common.aggregate``); GRPO's is ``seq-mean-token-mean``.
        max_len: constant normaliser for ``seq-mean-token-sum-norm``.

    Returns:
        ``PolicyLossOutput``.
    """
    mask = as_bool_mask(mask)
    log_ratio, ratio, _, token_loss, clipped = clipped_tokens(logprobs, old_logprobs, advantages, mask,
                                                              clip_eps_low, clip_eps_high)  # Eq. 3
    policy_loss = aggregate(token_loss, mask, agg, max_len=max_len)
    kl = kl_term(logprobs, ref_logprobs, mask, beta, agg, max_len)
    loss = policy_loss + beta * kl  # Eq. 3: − β D_KL inside J
    stats = clip_stats(ratio, clipped, mask, log_ratio, mask)  # per token, over valid tokens
    return PolicyLossOutput(loss=loss, policy_loss=policy_loss.detach(), kl=kl.detach(), **stats._asdict())


def grpo_signals(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> TokenSignals:
    """What ``grpo_loss`` (and Dr.GRPO's, DAPO's: the same surrogate) used per token: A_i, the
    token's log-ratio and whether the clip was active, on the loss tokens (``signals.py``)."""
    with torch.no_grad():
        mask = as_bool_mask(mask)
        parts = clipped_tokens(logprobs.detach(), old_logprobs, advantages, mask, clip_eps_low, clip_eps_high)
        return token_signals(mask, advantage=parts.advantages, log_ratio=parts.log_ratio, clipped=parts.clipped)


class GRPOParams(P.LossParams):
    """``grpo_loss``'s parameters (``learner.loss_params`` with ``loss: grpo``)."""

    clip_eps_low: float = P.clip_eps_low(0.2)
    clip_eps_high: float = P.clip_eps_high(0.2)
    beta: float = P.beta(0.0)
    agg: P.AggName = P.agg("seq-mean-token-mean")
    max_len: int | None = P.max_len()
