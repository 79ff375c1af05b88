"""The GRPO-family baselines: one method per loss family, plain groups, nothing else.

Each is its loss on every valid row of a batch of the oldest eligible groups (METHODS.md §0);
their differences are the loss (trainer/losses/) and, for Dr.GRPO, advantages without the std.
"""

from __future__ import annotations

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import Method

#: The package as reflexdb loads it (its entry point names this object; reflexdb/plugins.py).
plugin = Plugin(name="baselines", methods=(
    Method("grpo", "GRPO: clipped token surrogate, group-normalised advantages (DeepSeekMath)", "grpo"),
    Method("dr_grpo", "Dr.GRPO: GRPO without length and std normalisation (Liu et al., 2025)", "dr_grpo",
           advantage_scale="none"),
    Method("dapo", "DAPO: clip-higher, token-mean loss, overlong filter (Yu et al., 2025)", "dapo"),
    Method("gspo", "GSPO: one length-normalised ratio per sequence (Zheng et al., 2025)", "gspo"),
    Method("opmd", "OPMD: ratio-free policy gradient −A·log π (REINFORCE-style)", "opmd"),
))
