"""GRPO-λ (GRPO-lambda.md; METHODS.md §4): GRPO with eligibility traces for token credit, one package.

The method is its loss family (``loss.py``, registered when this package is imported) on every
valid row of plain groups; nothing else differs from GRPO. reflexdb finds the package through its
``reflexdb.plugins`` entry point (``grpo_lambda``), as it would a plug-in's.
"""

from __future__ import annotations

from reflexdb.trainer.methods import Method, register_method

from . import loss  # noqa: F401  (importing registers the loss family)

register_method(Method("grpo_lambda", "GRPO-λ: eligibility traces for token credit (GRPO-lambda.md)", "grpo_lambda"))
