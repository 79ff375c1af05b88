"""GSPO: Group Sequence Policy Optimization (Zheng et al., 2025, the GSPO objective).

    J = 1/G Σ_i min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high) A_i)
    s_i = (π_θ(o_i) / π_old(o_i))^{1/|o_i|} = exp(1/|o_i| Σ_t (log π_θ(o_{i,t}) − log π_old(o_{i,t})))

One length-normalised ratio per sequence, clipped per sequence (METHODS.md §0). The paper's
clipping ranges are much narrower than the token-level ones because s_i stays close to 1:
ε_low = 3e-4, ε_high = 4e-4 (their experiments), the defaults here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)

from . import params as P
from .common import (
    PolicyLossOutput,
    as_bool_mask,
    clip_stats,
    clipped_surrogate,
    kl_term,
    masked_log_ratio,
)
from .signals import TokenSignals, token_signals

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


class SequenceSurrogate(NamedTuple):
    """GSPO's pieces (``sequence_surrogate``): ``log_ratio`` ``[B, T]``, the rest ``[B]``."""

    log_ratio: Tensor  # per token, 0 off the mask
    seq_log_ratio: Tensor  # log s_i = mean_t(log π_θ − log π_old)
    seq_ratio: Tensor  # s_i
    nonempty: Tensor  # bool: the row has loss tokens
    seq_loss: Tensor  # −min(s_i A_i, clip(s_i) A_i)
    clipped: Tensor  # bool: the clipped branch is the active one


def sequence_surrogate(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                       clip_eps_low: float, clip_eps_high: float) -> SequenceSurrogate:
    """GSPO's length-normalised sequence ratio and its clipped surrogate, shared by the loss and
    its signals."""
    log_ratio = masked_log_ratio(logprobs, old_logprobs, mask)  # [B, T]
    lengths = mask.sum(-1)  # [B]
    nonempty = lengths > 0  # [B]
    seq_log_ratio = log_ratio.sum(-1) / lengths.clamp(min=1)  # [B]  mean_t(log π_θ − log π_old)
    seq_ratio = torch.exp(seq_log_ratio)  # [B]  s_i
    seq_loss, clipped = clipped_surrogate(
        seq_ratio, advantages.to(seq_ratio.dtype), clip_eps_low, clip_eps_high
    )  # [B]  GSPO objective, per sequence
    return SequenceSurrogate(log_ratio, seq_log_ratio, seq_ratio, nonempty, seq_loss, clipped)


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
) -> PolicyLossOutput:
    """GSPO sequence-level clipped loss.

    Args:
        logprobs, old_logprobs, mask: ``[B, T]``.
        advantages: ``[B]`` (sequence-level by construction).
        ref_logprobs, beta: optional k3 KL term, aggregated ``seq-mean-token-mean``.
        clip_eps_low, clip_eps_high: clip range of the sequence ratio.

    Returns:
        ``PolicyLossOutput``; ``clip_frac``, ``ratio_mean`` and ``ratio_max`` are over non-empty
        sequences and their ratio s_i. Sequences without valid tokens get no loss.
    """
    if advantages.dim() != 1:
        raise ValueError("GSPO takes sequence-level advantages [B]")
    mask = as_bool_mask(mask)
    log_ratio, _, seq_ratio, nonempty, seq_loss, clipped = sequence_surrogate(
        logprobs, old_logprobs, advantages, mask, clip_eps_low, clip_eps_high)  # [B]  GSPO objective
    n_seq = nonempty.sum().clamp(min=1)
    policy_loss = torch.where(nonempty, seq_loss, torch.zeros((), dtype=seq_loss.dtype)).sum() / n_seq  # 1/G Σ_i
    kl = kl_term(logprobs, ref_logprobs, mask, beta, "seq-mean-token-mean", None)
    loss = policy_loss + beta * kl
    stats = clip_stats(seq_ratio, clipped, nonempty, log_ratio, mask)  # per sequence: s_i over non-empty rows
    return PolicyLossOutput(loss=loss, policy_loss=policy_loss.detach(), kl=kl.detach(), **stats._asdict())


def gspo_signals(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
) -> TokenSignals:
    """What ``gspo_loss`` used per token: A_i, and the sequence's ratio s_i and its clip on every
    loss token of the row (the ratio GSPO clips is one per sequence; ``signals.py``)."""
    if advantages.dim() != 1:
        raise ValueError("GSPO takes sequence-level advantages [B]")
    with torch.no_grad():
        mask = as_bool_mask(mask)
        parts = sequence_surrogate(logprobs.detach(), old_logprobs, advantages, mask, clip_eps_low, clip_eps_high)
        return token_signals(mask, advantage=advantages, log_ratio=parts.seq_log_ratio, clipped=parts.clipped)


class GSPOParams(P.LossParams):
    """``gspo_loss``'s parameters. No ``agg``: one term per non-empty sequence, averaged over them
    (the KL term too)."""

    clip_eps_low: float = P.clip_eps_low(3e-4)
    clip_eps_high: float = P.clip_eps_high(4e-4)
    beta: float = P.beta(0.0)
