"""GRPO-λ (GRPO-lambda.md; METHODS.md §4): GRPO with eligibility traces for token credit.

The method is its loss family (trainer/losses/grpo_lambda.py, which this module registers by
importing it) on every valid row of plain groups; nothing else differs from GRPO.
"""

from __future__ import annotations

from ..losses import grpo_lambda  # noqa: F401  (importing registers the loss family)
from . import register_method
from .base import Method

register_method(Method("grpo_lambda", "GRPO-λ: eligibility traces for token credit (GRPO-lambda.md)", "grpo_lambda"))
