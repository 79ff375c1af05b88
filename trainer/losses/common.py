"""Pieces shared by the GRPO-family losses: loss aggregation, the clipped surrogate, the k3 KL,
and the typed results every loss returns.

Shapes: ``B`` sequences, ``T`` response positions (right-padded). ``mask`` marks the positions
that carry loss (response tokens; R3L's pivotal mask and DAPO's overlong filter zero more of it).

Reference: docs/losses.md, METHODS.md §0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor

AggMode = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


class PolicyLossOutput(NamedTuple):
    """Result of a clipped-surrogate loss (GRPO, Dr.GRPO, DAPO, GSPO).

    All fields are scalar tensors; only ``loss`` carries a graph.

    Attributes:
        loss: ``policy_loss + beta * kl``, with grad.
        policy_loss: the aggregated clipped surrogate (detached).
        kl: the aggregated k3 estimate of KL(π_θ || π_ref) (detached); 0 when ``beta == 0`` and no
            reference was given.
        clip_frac: share of valid tokens (of non-empty sequences for GSPO) where the clipped branch
            of the surrogate is the active one, i.e. whose gradient the clip removed.
        approx_kl: k3 estimate of KL(π_old || π_θ) over valid tokens, ``mean((ρ − 1) − log ρ)`` with
            the per-token ratio ρ = π_θ/π_old.
        ratio_mean: mean of the ratio that enters the clip (token ratio; sequence ratio for GSPO).
        ratio_max: max of that ratio.
        num_tokens: number of valid tokens.
    """

    loss: Tensor
    policy_loss: Tensor
    kl: Tensor
    clip_frac: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    num_tokens: Tensor


def as_bool_mask(mask: Tensor) -> Tensor:
    """``mask`` as bool, accepting bool or 0/1 numeric tensors."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``log π_θ − log π_old`` on valid tokens, exactly 0 elsewhere.

    ``torch.where`` (not a multiplication) so that padding holding ``-inf`` or NaN logprobs cannot
    leak NaN into the loss or the gradient.
    """
    return torch.where(mask, logprobs - old_logprobs, torch.zeros((), dtype=logprobs.dtype))  # [B, T]


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: AggMode,
    *,
    max_len: int | None = None,
) -> Tensor:
    """Reduce per-token values ``[B, T]`` to a scalar (METHODS.md §0 aggregation modes).

    - ``seq-mean-token-mean`` (GRPO): mean over each sequence's valid tokens, then mean over the
      sequences that have at least one valid token (an empty sequence has no mean; it is left out).
    - ``token-mean`` (DAPO): sum over all valid tokens / number of valid tokens in the batch.
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): each sequence's token sum divided by the constant
      ``max_len`` (the generation budget), then mean over all ``B`` rows — no data-dependent
      normaliser, as in Dr.GRPO's reference code (``masked_sum(·, axis=1) / generate_max_length``
      then mean).

    Args:
        values: per-token values ``[B, T]``.
        mask: valid tokens ``[B, T]``, bool or 0/1.
        mode: one of ``AGG_MODES``.
        max_len: the constant normaliser of ``seq-mean-token-sum-norm``; required there.

    Returns:
        Scalar tensor (0 with a graph when no token is valid).
    """
    mask = as_bool_mask(mask)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    masked = torch.where(mask, values, zero)  # [B, T]
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        counts = mask.sum(-1)  # [B]
        seq_means = masked.sum(-1) / counts.clamp(min=1)  # [B]
        return seq_means.sum() / (counts > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        if max_len is None or max_len <= 0:
            raise ValueError("seq-mean-token-sum-norm needs max_len > 0 (the generation budget)")
        return (masked.sum(-1) / max_len).mean()
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over ``mask`` (0 when the mask is empty)."""
    return aggregate(values, mask, "token-mean")


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_eps_low: float, clip_eps_high: float
) -> tuple[Tensor, Tensor]:
    """Per-token PPO loss ``−min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)`` and where the clip is active.

    Args:
        ratio: ρ, any shape.
        advantages: A, broadcastable to ``ratio``.

    Returns:
        ``(loss, clipped)``: the negated surrogate (to minimise) and a bool tensor that is true where
        the clipped branch is strictly the smaller objective (its gradient is zero there).
    """
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(π_θ || π_ref): ``exp(ref − lp) − (ref − lp) − 1`` (Schulman).

    Zero on invalid tokens. Non-negative, unbiased for samples of π_θ.
    """
    delta = torch.where(mask, ref_logprobs - logprobs, torch.zeros((), dtype=logprobs.dtype))  # [B, T]
    return torch.exp(delta) - delta - 1.0


def kl_term(
    logprobs: Tensor,
    ref_logprobs: Tensor | None,
    mask: Tensor,
    beta: float,
    mode: AggMode,
    max_len: int | None,
) -> Tensor:
    """Aggregated k3 KL to the reference, aggregated like the policy loss; 0 without a reference.

    Raises:
        ValueError: ``beta != 0`` without ``ref_logprobs`` (silently dropping the KL would hide a
            misconfiguration).
    """
    if ref_logprobs is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} needs ref_logprobs")
        return torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return aggregate(k3_kl(logprobs, ref_logprobs, mask), mask, mode, max_len=max_len)


def policy_ratio_stats(log_ratio: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(approx_kl, num_tokens)``: k3 KL(π_old || π_θ) over valid tokens, and their count."""
    with torch.no_grad():
        ratio = torch.exp(log_ratio)
        approx_kl = masked_mean(ratio - 1.0 - log_ratio, mask)
        return approx_kl, mask.sum()


class ClipStats(NamedTuple):
    """Detached statistics of a clipped ratio (the fields ``PolicyLossOutput`` shares with
    ``GRPOLambdaOutput``; see ``PolicyLossOutput`` for their meaning)."""

    clip_frac: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor
    num_tokens: Tensor


def clip_stats(ratio: Tensor, clipped: Tensor, counted: Tensor, log_ratio: Tensor, mask: Tensor) -> ClipStats:
    """Clip fraction and ratio mean/max over the ``counted`` entries of the ratio that enters the
    clip, and k3 ``approx_kl`` / ``num_tokens`` over the valid tokens.

    Args:
        ratio: the clipped ratio, ``[B, T]`` per token (GRPO, GRPO-λ) or ``[B]`` per sequence (GSPO).
        clipped: bool like ``ratio``: where the clipped branch is active (``clipped_surrogate``).
        counted: bool like ``ratio``: the entries that count (valid tokens; non-empty sequences).
        log_ratio: per-token ``log π_θ − log π_old`` ``[B, T]``, 0 off the mask.
        mask: valid tokens ``[B, T]``.

    Returns:
        ``ClipStats``; ratio mean and max are 1 when nothing counts.
    """
    with torch.no_grad():
        n = counted.sum().clamp(min=1)
        kept = ratio.detach()[counted]
        approx_kl, num_tokens = policy_ratio_stats(log_ratio.detach(), mask)
        return ClipStats(
            clip_frac=(clipped & counted).sum() / n,
            approx_kl=approx_kl,
            ratio_mean=kept.mean() if kept.numel() else ratio.new_ones(()),
            ratio_max=kept.max() if kept.numel() else ratio.new_ones(()),
            num_tokens=num_tokens,
        )


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Advantages ``[B]`` (per sequence) or ``[B, T]`` (per token) as a tensor broadcastable to ``like``."""
    if advantages.dim() == 1:
        return advantages.to(like.dtype)[:, None]  # [B, 1]
    if advantages.shape != like.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} vs tokens {tuple(like.shape)}")
    return advantages.to(like.dtype)
