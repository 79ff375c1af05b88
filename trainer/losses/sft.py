"""SFT / RAFT: negative log-likelihood of the chosen tokens.

RAFT (Dong et al., 2023, reward-ranked fine-tuning) is SFT on the best-rewarded samples; the
selection is done when the batch is assembled, so the loss is plain NLL. R3L's auxiliary SFT term on
the reflect and retry sets (R3L.md Algorithm 1 line 39) is the same function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)

from . import params as P
from .common import AggMode, aggregate, as_bool_mask
from .signals import TokenSignals, token_signals

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


class SFTLossOutput(NamedTuple):
    """Result of the NLL loss.

    Attributes:
        loss: aggregated NLL, with grad.
        nll: the same value, detached.
        num_tokens: number of valid tokens.
    """

    loss: Tensor
    nll: Tensor
    num_tokens: Tensor


def sft_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor | None,
    mask: Tensor,
    *,
    agg: AggMode = "token-mean",
    max_len: int | None = None,
) -> SFTLossOutput:
    """NLL ``agg(−log π_θ)``.

    Args:
        logprobs: ``log π_θ`` of the target tokens ``[B, T]`` (with grad).
        old_logprobs: unused (may be ``None``); present so that every registered loss is called
            with the same positional arguments.
        advantages: unused (may be ``None``), as above.
        mask: target tokens ``[B, T]``.
        agg: aggregation mode (``token-mean`` is the usual SFT mean over target tokens).
        max_len: only for ``seq-mean-token-sum-norm``.
    """
    mask = as_bool_mask(mask)
    lp = torch.where(mask, logprobs, torch.zeros((), dtype=logprobs.dtype))  # [B, T]
    loss = aggregate(-lp, mask, agg, max_len=max_len)  # mean of −log π_θ
    return SFTLossOutput(loss=loss, nll=loss.detach(), num_tokens=mask.sum())


def sft_signals(logprobs: Tensor, old_logprobs: Tensor | None, advantages: Tensor | None,
                mask: Tensor) -> TokenSignals:
    """What ``sft_loss`` used per token: no advantage, no ratio, no clip (NaN, NaN, false)."""
    return token_signals(as_bool_mask(mask))


class SFTParams(P.LossParams):
    """``sft_loss``'s parameters (no reference model, no KL)."""

    agg: P.AggName = P.agg("token-mean")
    max_len: int | None = P.max_len()
