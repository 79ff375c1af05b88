"""Micro-batch weights for gradient accumulation that reproduce the full batch's loss exactly.

Every registered loss is ``S / max(N, 1)`` with ``S`` a sum of per-row terms and ``N`` the family's
normaliser (``LossSpec.normaliser``: loss tokens, rows with loss tokens, or all rows; see
``registry``). Split the rows into micro-batches ``m`` and

    Σ_m  N(m) / N(full) · loss(m)  =  Σ_m S(m) / N(full)  =  loss(full)

(a micro-batch with ``N(m) = 0`` has ``S(m) = 0``), and the same holds for the gradient. The weight
must use the normaliser of the family *after its own filters* (DAPO's overlong filter) and of its
aggregation (Dr.GRPO divides by every row, an empty one included); a learner that weighted by
unfiltered tokens or by non-empty rows for every family got DAPO and Dr.GRPO wrong
(tests/test_step_math.py has both hand cases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Sequence

from pydantic import BaseModel

from .registry import LossSpec

if TYPE_CHECKING:  # annotations only: torch itself may be imported lazily (reflexdb check)
    from torch import Tensor


def micro_batch_weights(
    spec: LossSpec,
    params: BaseModel,
    mask: Tensor,
    truncated: Tensor | None,
    slices: Sequence[slice],
    *,
    total: float | None = None,
) -> list[float]:
    """``N(rows[sl]) / N(full)`` for each slice: the weight of each micro-batch's loss.

    Args:
        spec, params: the loss family and its parameters.
        mask: loss tokens ``[B, T]`` of the whole step (every rank's rows, when the step is sharded:
            the slices then index into it).
        truncated: ``[B]`` bool (DAPO's overlong filter), or ``None``.
        slices: row slices of the micro-batches (empty ones allowed: weight 0).
        total: ``N(full)`` when the caller has it (e.g. all-reduced over ranks); default: from ``mask``.

    Returns:
        One weight per slice; they sum to 1 unless ``N(full) = 0`` (then all are 0: the loss is 0).
    """
    if total is None:
        total = spec.normaliser(mask, params, truncated=truncated)
    weights = []
    for sl in slices:
        part = spec.normaliser(mask[sl], params, truncated=None if truncated is None else truncated[sl])
        weights.append(part / total if total > 0 else 0.0)
    return weights
