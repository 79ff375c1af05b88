"""Loss library of the learner: one small pure function per family, a registry by name.

See docs/losses.md for the equations, references and aggregation modes.
"""

from .common import AGG_MODES, AggMode, PolicyLossOutput, aggregate, clipped_surrogate, k3_kl
from .dapo import dapo_loss, overlong_filter
from .dr_grpo import dr_grpo_loss
from .grpo import grpo_loss
from .grpo_lambda import (
    GRPOLambdaOutput,
    discounted_cumsum,
    grpo_lambda_loss,
    soft_clamp,
    trace_matrix,
    trace_sum,
    trace_sum_dense,
)
from .gspo import gspo_loss
from .opmd import PGLossOutput, opmd_loss
from .registry import LOSSES, get_loss, register_loss
from .sft import SFTLossOutput, sft_loss

__all__ = [
    "AGG_MODES",
    "AggMode",
    "GRPOLambdaOutput",
    "LOSSES",
    "PGLossOutput",
    "PolicyLossOutput",
    "SFTLossOutput",
    "aggregate",
    "clipped_surrogate",
    "dapo_loss",
    "discounted_cumsum",
    "dr_grpo_loss",
    "get_loss",
    "grpo_lambda_loss",
    "grpo_loss",
    "gspo_loss",
    "k3_kl",
    "opmd_loss",
    "overlong_filter",
    "register_loss",
    "sft_loss",
    "soft_clamp",
    "trace_matrix",
    "trace_sum",
    "trace_sum_dense",
]
