"""bestofn's loss: the run's loss family (GRPO by default) on every answer, term ``policy``, and the
NLL of each group's best answer, term ``sft``, weighted by ``bestofn.sft_weight``."""

from __future__ import annotations

from reflexdb.trainer.losses.sft import SFTParams
from reflexdb.trainer.method_api import LossTerm


def best_rows(batch, min_reward: float):
    """``[B]`` bool: each group's best answer (highest reward, then shortest), if it reaches ``min_reward``."""
    import torch  # here, not at the top: `reflexdb check` loads every plug-in and imports no torch

    keep = torch.zeros(batch.size, dtype=torch.bool)
    good = batch.valid & (batch.rewards >= min_reward)  # [B]
    for g in range(len(batch.group_ids)):  # a method's auxiliary rows have group numbers beyond these
        rows = (good & (batch.group_index == g)).nonzero().flatten()
        if len(rows):
            top = rows[batch.rewards[rows] == batch.rewards[rows].max()]
            keep[top[int(torch.argmin(batch.response_lengths[top]))]] = True
    return keep


def terms(cfg, params) -> list[LossTerm]:
    """``Method.terms``: ``params`` are the main family's parameters (``learner.loss_params``)."""
    b = cfg.section("bestofn")
    out = [LossTerm("policy", cfg.loss_family, params)]
    if b.sft_weight > 0:
        out.append(LossTerm("sft", "sft", SFTParams(), rows=lambda batch: best_rows(batch, b.min_reward),
                            weight=b.sft_weight))
    return out
