"""Typed parameters of the loss families: the fields they share, with bounds and descriptions.

Each family declares its parameter model next to its function (``GRPOParams`` in ``grpo.py``, ...)
from these fields, with the function's own defaults; ``registry.LossSpec.parse`` validates
``learner.loss_params`` against it. Unknown keys are errors (``extra="forbid"``). The descriptions
feed the configuration reference (docs/configuration.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: The aggregation modes of ``common.aggregate`` (METHODS.md §0), as a type pydantic validates.
AggName = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


class LossParams(BaseModel):
    """Base of every family's parameter model: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def clip_eps_low(default: float) -> Any:
    return Field(default, ge=0.0, le=1.0, description="ε_low: the ratio is clipped at 1 − ε_low.")


def clip_eps_high(default: float) -> Any:
    return Field(default, ge=0.0, le=10.0,
                 description="ε_high: the ratio is clipped at 1 + ε_high (DAPO clip-higher: 0.28).")


def beta(default: float) -> Any:
    return Field(default, ge=0.0, le=10.0,
                 description="KL coefficient to the frozen base model (k3 estimator); 0 = no reference model.")


def agg(default: str) -> Any:
    return Field(default, description="Loss aggregation mode (METHODS.md §0): seq-mean-token-mean (GRPO), "
                                      "token-mean (DAPO) or seq-mean-token-sum-norm (Dr.GRPO).")


def max_len() -> Any:
    return Field(None, ge=1, description="Normaliser L_max of seq-mean-token-sum-norm "
                                         "(default: collector.sampling.max_new_tokens).")
