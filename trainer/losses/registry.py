"""Name → loss function. The learner looks its loss up here once; no ``if/elif`` in a step.

Every registered loss is called the same way::

    out = get_loss(name)(logprobs, old_logprobs, advantages, mask, **hparams)

with ``[B, T]`` logprobs / old_logprobs / mask and ``[B]`` advantages; ``hparams`` are the family's
keyword arguments (from the config) and optional tensors (``ref_logprobs``; ``truncated`` for DAPO).
``out`` is a NamedTuple whose first field is ``loss`` (scalar with grad) and whose other fields are
detached scalar statistics, logged as ``loss/<field>``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from .dapo import dapo_loss
from .dr_grpo import dr_grpo_loss
from .grpo import grpo_loss
from .grpo_lambda import grpo_lambda_loss
from .gspo import gspo_loss
from .opmd import opmd_loss
from .sft import sft_loss

LossFn = Callable[..., NamedTuple]

LOSSES: dict[str, LossFn] = {
    "grpo": grpo_loss,
    "dr_grpo": dr_grpo_loss,
    "dapo": dapo_loss,
    "gspo": gspo_loss,
    "opmd": opmd_loss,
    "sft": sft_loss,
    "grpo_lambda": grpo_lambda_loss,
}


def register_loss(name: str, fn: LossFn) -> LossFn:
    """Add a loss under ``name`` (e.g. LTE's shaped off-policy term); names are unique."""
    if name in LOSSES and LOSSES[name] is not fn:
        raise ValueError(f"loss {name!r} is already registered")
    LOSSES[name] = fn
    return fn


def get_loss(name: str) -> LossFn:
    """The loss registered under ``name``.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    try:
        return LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown loss {name!r}; known: {sorted(LOSSES)}") from None
