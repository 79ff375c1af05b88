"""R3L's pivotal credit assignment (R3L.md Sec. 4.2, Eq. 10; METHODS.md §1).

The exploration group's base episode and its distilled twin share every turn before the pivot
``k_pivot`` (the twin *is* the base episode up to there) and differ from it on: only the suffix
says which path was better. Eq. 10 zeroes the loss on the shared prefix, at the turn level::

    mask_k^t = 0  if k < k_pivot,  1 otherwise                                          (Eq. 10)

A turn's tokens are a span of ``response_ids``, so "every turn before k_pivot" is "every token
before the start of assistant turn k_pivot" (the collector stores that offset as
``meta.pivot_token``; 0 for a row without a pivot: nothing masked). Tokens the environment wrote
carry no loss anyway (the stored loss mask).

R3L's loss (Eq. 12) is ``opmd_loss`` (``trainer/losses/opmd.py``) with this mask and the
amplified advantages of ``trainer/advantages.positive_amplification`` (Eq. 11).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reflexdb.lazy import torch  # imported on first use (reflexdb check never computes)

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


def pivotal_mask(loss_mask: Tensor, pivot_token: Tensor) -> Tensor:
    """Eq. 10 on a batch: the loss tokens of turns ``k ≥ k_pivot`` only.

    Args:
        loss_mask: ``[B, T]`` bool, the stored loss mask (assistant tokens).
        pivot_token: ``[B]`` int, where assistant turn ``k_pivot`` starts in each row's response
            (0: no pivot, every loss token kept).

    Returns:
        ``[B, T]`` bool: ``loss_mask`` with the tokens before ``pivot_token`` cleared.
    """
    t = torch.arange(loss_mask.shape[1], device=loss_mask.device)  # [T]
    after = t[None, :] >= pivot_token.to(loss_mask.device)[:, None]  # [B, T]  turn k >= k_pivot (Eq. 10)
    return loss_mask.bool() & after


__all__ = ["pivotal_mask"]
