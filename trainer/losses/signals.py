"""Per-token learner signals: what a loss family's loss used at each token of a row.

The learner records them beside each consumed row when ``learner.record_token_signals`` is on
(table ``token_signals``, revision 0028; the explorer shades a trajectory's tokens by them). Each
family computes them from the same pieces its loss is built from (``grpo.clipped_tokens``,
``gspo.sequence_surrogate``, GRPO-λ's ``lambda_tokens``), so what is recorded is what the loss
used, not a recomputation of what it might have used:

=============  =============================  ==========================  ======================
family         advantage                      log-ratio                   clipped
=============  =============================  ==========================  ======================
grpo, dr_grpo  A_i on each loss token         log π_θ − log π_old         PPO clip active
dapo           as grpo, truncated rows none   as grpo                     as grpo
gspo           A_i                            the sequence's log s_i      the sequence's clip
opmd           A_i                            log π_θ − log π_old (a      never (no clip)
                                              metric: the loss has none)
sft            none                           none                        never
grpo_lambda    Â = max(A, min_advantage);     ε-trace: the traced S_t;    PPO clip active
               ε-weight: w_t · Â              ε-weight: the plain one
other          the advantage it was given     none                        never
=============  =============================  ==========================  ======================

"None" is NaN (stored as a NULL array when a row has no value at all); tokens outside the term's
loss tokens (after the family's own filters) have none either. The ratio is kept as its log: in
float16 (what the table stores) a ratio near 1 has a resolution of about 1e-3, coarser than GSPO's
clip range (3e-4), while its log near 0 keeps three significant digits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)

from .common import as_bool_mask, broadcast_advantages

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


class TokenSignals(NamedTuple):
    """What a loss used at each token, detached. Every field ``[B, T]``.

    Attributes:
        advantage: float32, the advantage that multiplied the token's term (per token where the
            family gives per-token advantages); NaN where the loss gave it none.
        log_ratio: float32, the log of the importance ratio that entered the clip (π_θ/π_old per
            token; GSPO's sequence ratio on each of its tokens; GRPO-λ's traced ratio); NaN where
            the loss has none.
        clipped: bool, where the clipped branch of the surrogate was the active one (its gradient
            removed by the clip); false for a family without a clip.
    """

    advantage: Tensor
    log_ratio: Tensor
    clipped: Tensor


def token_signals(mask: Tensor, *, advantage: Tensor | None = None, log_ratio: Tensor | None = None,
                  clipped: Tensor | None = None) -> TokenSignals:
    """``TokenSignals`` on the loss tokens ``mask`` ``[B, T]``: each given value broadcast to
    ``[B, T]`` (``[B, 1]`` advantages, ``[B]`` per-sequence values as ``[B, 1]``) and kept on the
    mask only; a value not given is NaN (false for ``clipped``) everywhere."""
    mask = as_bool_mask(mask)
    nan = torch.full(mask.shape, float("nan"), dtype=torch.float32, device=mask.device)

    def on_mask(v: Tensor | None) -> Tensor:
        if v is None:
            return nan
        v = v.detach().to(torch.float32)
        return torch.where(mask, (v[:, None] if v.dim() == 1 else v).expand(mask.shape), nan)

    flags = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device) if clipped is None else \
        (clipped.detach()[:, None] if clipped.dim() == 1 else clipped.detach()).expand(mask.shape) & mask
    return TokenSignals(advantage=on_mask(advantage), log_ratio=on_mask(log_ratio), clipped=flags)


def given_advantage_signals(logprobs: Tensor, old_logprobs: Tensor | None, advantages: Tensor | None,
                            mask: Tensor) -> TokenSignals:
    """The signals of a family that defines none (a plug-in's loss, LTE's shaped term): the
    advantage it was given on its loss tokens, no ratio, no clip."""
    adv = None if advantages is None else broadcast_advantages(advantages, logprobs)  # [B, 1] or [B, T]
    return token_signals(mask, advantage=adv)


__all__ = ["TokenSignals", "given_advantage_signals", "token_signals"]
