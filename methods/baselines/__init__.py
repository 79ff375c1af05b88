"""The GRPO-family baselines: one method per loss family, plain groups, nothing else.

Each is its loss on every valid row of a batch of the oldest eligible groups (METHODS.md §0);
their differences are the loss (trainer/losses/) and, for Dr.GRPO, advantages without the std.
"""

from __future__ import annotations

from reflexdb.trainer.methods import Method, register_method

register_method(Method("grpo", "GRPO: clipped token surrogate, group-normalised advantages (DeepSeekMath)", "grpo"))
register_method(Method("dr_grpo", "Dr.GRPO: GRPO without length and std normalisation (Liu et al., 2025)",
                       "dr_grpo", advantage_scale="none"))
register_method(Method("dapo", "DAPO: clip-higher, token-mean loss, overlong filter (Yu et al., 2025)", "dapo"))
register_method(Method("gspo", "GSPO: one length-normalised ratio per sequence (Zheng et al., 2025)", "gspo"))
register_method(Method("opmd", "OPMD: ratio-free policy gradient −A·log π (REINFORCE-style)", "opmd"))
