"""GRPO-λ (GRPO-lambda.md; METHODS.md §4): GRPO with eligibility traces for token credit, one package.

The method is its loss family (``loss.py``, declared in the package's :class:`Plugin`) on every
valid row of plain groups; nothing else differs from GRPO. reflexdb finds the package through its
``reflexdb.plugins`` entry point (``grpo_lambda``), as it would a plug-in's.
"""

from __future__ import annotations

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import Method

from . import loss

#: The package as reflexdb loads it (its entry point names this object; reflexdb/plugins.py).
plugin = Plugin(name="grpo_lambda", losses={"grpo_lambda": loss.SPEC},
                methods=(Method("grpo_lambda", "GRPO-λ: eligibility traces for token credit (GRPO-lambda.md)",
                                "grpo_lambda"),))
