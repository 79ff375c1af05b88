"""Loss library of the learner: one small pure function per family, each with its typed
parameters, in a registry by name (``LossSpec``: parameters, call, normaliser).

See docs/losses.md for the equations, references and aggregation modes, and ``registry`` /
``accumulate`` for how a step split into micro-batches keeps the full batch's loss.
"""

from .accumulate import micro_batch_weights
from .common import AGG_MODES, AggMode, ClipStats, PolicyLossOutput, aggregate, clip_stats, clipped_surrogate, k3_kl
from .dapo import DAPOParams, dapo_loss, overlong_filter
from .dr_grpo import DrGRPOParams, dr_grpo_loss
from .grpo import GRPOParams, grpo_loss
from .gspo import GSPOParams, gspo_loss
from .opmd import OPMDParams, PGLossOutput, opmd_loss
from .params import LossParams
from .registry import LOSSES, LossSpec, get_loss, get_loss_spec, loss_names, register_loss, register_loss_spec
from .sft import SFTLossOutput, SFTParams, sft_loss
from .signals import TokenSignals, token_signals

__all__ = [
    "AGG_MODES",
    "AggMode",
    "ClipStats",
    "DAPOParams",
    "DrGRPOParams",
    "GRPOParams",
    "GSPOParams",
    "LOSSES",
    "LossParams",
    "LossSpec",
    "OPMDParams",
    "PGLossOutput",
    "PolicyLossOutput",
    "SFTLossOutput",
    "SFTParams",
    "TokenSignals",
    "aggregate",
    "clip_stats",
    "clipped_surrogate",
    "dapo_loss",
    "dr_grpo_loss",
    "get_loss",
    "get_loss_spec",
    "grpo_loss",
    "gspo_loss",
    "k3_kl",
    "loss_names",
    "micro_batch_weights",
    "opmd_loss",
    "overlong_filter",
    "register_loss",
    "register_loss_spec",
    "sft_loss",
    "token_signals",
]
