"""Dr.GRPO ("GRPO done right", Liu et al., 2025, *Understanding R1-Zero-Like Training*, the Dr. GRPO
objective): the GRPO surrogate without its response-length and question-difficulty biases.

    J = 1/G Σ_i Σ_t min(ρ_{i,t} A_i, clip(ρ_{i,t}, 1−ε, 1+ε) A_i) / L_max,   A_i = r_i − mean(r)

- no ``1/|o_i|``: each sequence's token sum is divided by a constant ``L_max`` (the generation
  budget) — aggregation ``seq-mean-token-sum-norm``;
- no std in the advantage: ``advantages.group_advantages(..., scale="none")`` (not this function's
  business: it receives advantages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING


from . import params as P
from .common import PolicyLossOutput
from .grpo import grpo_loss

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


def dr_grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    max_len: int,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> PolicyLossOutput:
    """Dr.GRPO loss: GRPO's clipped surrogate aggregated as ``seq-mean-token-sum-norm``.

    Args:
        logprobs, old_logprobs, mask: ``[B, T]``, as in ``grpo_loss``.
        advantages: ``[B]``, computed without the std (``scale="none"``).
        max_len: the constant normaliser ``L_max`` (max response tokens of the run), required.
        ref_logprobs, beta, clip_eps_low, clip_eps_high: as in ``grpo_loss``.
    """
    return grpo_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        ref_logprobs=ref_logprobs,
        beta=beta,
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        agg="seq-mean-token-sum-norm",  # Dr. GRPO: constant L_max instead of 1/|o_i|
        max_len=max_len,
    )


class DrGRPOParams(P.LossParams):
    """``dr_grpo_loss``'s parameters. No ``agg``: Dr.GRPO's aggregation is always
    ``seq-mean-token-sum-norm``; ``max_len`` (L_max) is required by the time the loss is called
    (``LossSpec.parse`` fills it from ``collector.sampling.max_new_tokens``)."""

    clip_eps_low: float = P.clip_eps_low(0.2)
    clip_eps_high: float = P.clip_eps_high(0.2)
    beta: float = P.beta(0.0)
    max_len: int | None = P.max_len()
