"""DAPO (Yu et al., 2025, Sec. 3, the DAPO objective): clip-higher, token-level loss, overlong filtering.

    J = 1/Σ_i|o_i| Σ_i Σ_t min(ρ_{i,t} A_i, clip(ρ_{i,t}, 1−ε_low, 1+ε_high) A_i)

- clip-higher: decoupled ε_low = 0.2, ε_high = 0.28 (Sec. 3.1);
- token-level policy gradient loss: aggregation ``token-mean`` (Sec. 3.3);
- overlong filtering: truncated samples get no loss (Sec. 3.4, "Overlong Filtering").
Dynamic sampling (drop groups whose rewards are all equal) and the soft overlong punishment are
batch assembly and reward shaping, not part of the loss. CLEANER uses this loss (METHODS.md §5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from . import params as P
from .common import AggMode, PolicyLossOutput, as_bool_mask
from .grpo import grpo_loss, grpo_signals
from .signals import TokenSignals

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


def overlong_filter(mask: Tensor, truncated: Tensor) -> Tensor:
    """``mask`` with every token of a truncated sequence removed.

    Args:
        mask: ``[B, T]``.
        truncated: ``[B]`` bool, true where generation hit the length limit.
    """
    return as_bool_mask(mask) & ~truncated.bool()[:, None]  # [B, T]


def dapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    truncated: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    agg: AggMode = "token-mean",
    max_len: int | None = None,
) -> PolicyLossOutput:
    """DAPO loss.

    Args:
        logprobs, old_logprobs, advantages, mask: as in ``grpo_loss``.
        truncated: ``[B]`` bool; truncated sequences are masked out (overlong filtering). ``None``
            disables the filter.
        ref_logprobs, beta: KL term (DAPO drops it: β = 0).
        clip_eps_low, clip_eps_high: clip-higher, 0.2 / 0.28.
        agg: ``token-mean`` (DAPO's token-level loss).
        max_len: only for ``agg="seq-mean-token-sum-norm"``.
    """
    if truncated is not None:
        mask = overlong_filter(mask, truncated)  # Sec. 3.4
    return grpo_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        ref_logprobs=ref_logprobs,
        beta=beta,
        clip_eps_low=clip_eps_low,  # Sec. 3.1 clip-higher
        clip_eps_high=clip_eps_high,
        agg=agg,  # Sec. 3.3 token-level loss
        max_len=max_len,
    )


def dapo_signals(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    truncated: Tensor | None = None,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
) -> TokenSignals:
    """What ``dapo_loss`` used per token: GRPO's signals after the overlong filter (a truncated
    row has no loss token, so no signal)."""
    if truncated is not None:
        mask = overlong_filter(mask, truncated)  # Sec. 3.4
    return grpo_signals(logprobs, old_logprobs, advantages, mask, clip_eps_low=clip_eps_low,
                        clip_eps_high=clip_eps_high)


class DAPOParams(P.LossParams):
    """``dapo_loss``'s parameters, plus the switch of its overlong filter."""

    clip_eps_low: float = P.clip_eps_low(0.2)
    clip_eps_high: float = P.clip_eps_high(0.28)
    beta: float = P.beta(0.0)
    agg: P.AggName = P.agg("token-mean")
    max_len: int | None = P.max_len()
    overlong_filter: bool = Field(True, description="DAPO Sec. 3.4 overlong filtering: truncated responses "
                                                    "(finish_reason 'length') carry no loss.")
