"""LTE's mixed-policy loss (Huang et al., 2025, "Learning to Explore"; LTE.md Sec. 3.2, Eq. 6-8).

A none-pass group whose hinted extra rollouts found G' correct answers trains as a mixed group:
the G' correct hinted rollouts o' replace G' of the failed originals (Appendix B), and

    J_Mixed = 1/Z' Σ_{i ≤ G'} Σ_t f(r'_{i,t}) A'_i  +  1/Z Σ_{i ≤ G−G'} Σ_t CLIP(r_{s_i,t}, A_{s_i}, ε)   (Eq. 8)
    r'_{i,t} = π_θ(o'_{i,t} | q, o'_{i,<t}) / π_old(o'_{i,t} | H_q, q, o'_{i,<t})                      (Eq. 6)
    f(r') = r' / (r' + γ),  γ = 0.1, no clip                                                          (Eq. 7)
    Z = Σ |o_i| over the on-policy rows, Z' the same over the replaced rows                          (Eq. 2)

π_θ(o' | q) is scored with the **plain** prompt (the hinted rollout's prompt ids for training are
the plain prompt's); the denominator is the hinted behaviour log-prob, or 1 as in the paper's
experiments (App. C: "we treat the old policy term ... as 1"), ``denominator``. Advantages are the
group's, normalised over the group after replacement (computed by the learner, as for GRPO).

The two halves have their own normalisers, so the learner runs them as two loss terms (the
on-policy half is ``grpo`` with ``agg: token-mean``; the off-policy half is the registered family
``lte_shaped``), each weighted per micro-batch by its own normaliser (``accumulate.py``).
:func:`lte_mixed_loss` is Eq. 8 in one call, for tests and for users of the bare function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)
from pydantic import Field

from reflexdb.trainer.losses import params as P
from reflexdb.trainer.losses.common import aggregate, as_bool_mask, broadcast_advantages, masked_log_ratio
from reflexdb.trainer.losses.grpo import grpo_loss
from reflexdb.trainer.losses.registry import LossSpec

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor

Denominator = Literal["one", "behaviour"]


class LTEShapedOutput(NamedTuple):
    """Result of :func:`lte_shaped_loss`.

    Attributes:
        loss: ``−(1/Z') Σ f(r') A'``, with grad.
        policy_loss: the same, detached.
        shaped_mean: mean of f(r') over the valid tokens.
        ratio_mean: mean of r' over the valid tokens.
        num_tokens: Z'.
    """

    loss: Tensor
    policy_loss: Tensor
    shaped_mean: Tensor
    ratio_mean: Tensor
    num_tokens: Tensor


def lte_shaped_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    gamma: float = 0.1,
    denominator: Denominator = "one",
) -> LTEShapedOutput:
    """The off-policy half of Eq. 8 on the replaced (hinted) rows.

    Args:
        logprobs: ``log π_θ(o' | q)`` under the plain prompt ``[B, T]`` (with grad).
        old_logprobs: the hinted behaviour log-probs ``log π_old(o' | H_q, q)`` ``[B, T]``; read
            only when ``denominator == "behaviour"``.
        advantages: ``[B]`` A', the group's advantages after replacement.
        mask: the replaced rows' loss tokens ``[B, T]``.
        gamma: γ of the policy shaping f(r') = r'/(r' + γ) (Eq. 7).
        denominator: ``one`` (r' = π_θ, the paper's experiments) or ``behaviour`` (Eq. 6 as written).
    """
    mask = as_bool_mask(mask)
    if denominator == "behaviour":
        if old_logprobs is None:
            raise ValueError("denominator 'behaviour' needs the hinted behaviour log-probs")
        log_ratio = masked_log_ratio(logprobs, old_logprobs, mask)  # Eq. 6
    else:
        log_ratio = torch.where(mask, logprobs, torch.zeros((), dtype=logprobs.dtype))  # Eq. 6, π_old := 1
    ratio = torch.exp(log_ratio)  # [B, T]
    shaped = ratio / (ratio + gamma)  # Eq. 7, no clip
    adv = broadcast_advantages(advantages, ratio)  # [B, 1]
    loss = aggregate(-(shaped * adv), mask, "token-mean")  # Eq. 8: −(1/Z') Σ f(r') A'
    n = mask.sum()
    return LTEShapedOutput(loss=loss, policy_loss=loss.detach(), shaped_mean=aggregate(shaped, mask, "token-mean").detach(),
                           ratio_mean=aggregate(ratio, mask, "token-mean").detach(), num_tokens=n.to(logprobs.dtype))


class LTEShapedParams(P.LossParams):
    """``lte_shaped_loss``'s parameters."""

    gamma: float = Field(0.1, gt=0.0, le=10.0, description="γ of LTE's policy shaping f(r') = r'/(r' + γ) (Eq. 7).")
    denominator: Denominator = Field("one", description="Ratio denominator of a hinted rollout: 'one' (the paper's experiments, App. C) or 'behaviour' (its stored log-prob under the hinted prompt, Eq. 6).")


class LTEMixedOutput(NamedTuple):
    loss: Tensor
    on_policy_loss: Tensor
    off_policy_loss: Tensor
    on_policy_tokens: Tensor
    off_policy_tokens: Tensor


def lte_mixed_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    replaced: Tensor,
    *,
    hinted_logprobs: Tensor | None = None,
    gamma: float = 0.1,
    denominator: Denominator = "one",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> LTEMixedOutput:
    """Eq. 8 in one call: ``−J_Mixed`` over a batch of mixed groups.

    Args:
        logprobs, old_logprobs: ``[B, T]``; ``old_logprobs`` is π_old of the on-policy rows.
        advantages: ``[B]``.
        mask: loss tokens ``[B, T]``.
        replaced: ``[B]`` bool, the hinted rows that replaced a failed original.
        hinted_logprobs: ``[B, T]`` hinted behaviour log-probs (``denominator == "behaviour"``).
    """
    mask = as_bool_mask(mask)
    replaced = replaced.to(torch.bool)[:, None]  # [B, 1]
    on = grpo_loss(logprobs, old_logprobs, advantages, mask & ~replaced, clip_eps_low=clip_eps_low,
                   clip_eps_high=clip_eps_high, agg="token-mean")  # Eq. 8, second sum: 1/Z Σ CLIP
    off = lte_shaped_loss(logprobs, hinted_logprobs, advantages, mask & replaced, gamma=gamma,
                          denominator=denominator)  # Eq. 8, first sum: 1/Z' Σ f(r') A'
    return LTEMixedOutput(loss=on.loss + off.loss, on_policy_loss=on.loss.detach(), off_policy_loss=off.loss.detach(),
                          on_policy_tokens=(mask & ~replaced).sum(), off_policy_tokens=(mask & replaced).sum())


SPEC = LossSpec("lte_shaped", lte_shaped_loss, LTEShapedParams, agg="token-mean")  # LTE Eq. 7-8: 1/Z' Σ f(r') A'
