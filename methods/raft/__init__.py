"""RAFT: reward-ranked fine-tuning (Dong et al., 2023, Algorithm 1).

For each prompt the collector samples K responses (a plain group, K = ``collector.group_size``);
the learner keeps the best-rewarded one of each group (``best_of_group``: the first of equals,
valid rewards only) and fine-tunes on it with the NLL loss (``trainer/losses/sft.py``). Optionally
only when that best reward reaches ``raft.min_reward`` (with a 0/1 reward, ``1.0`` keeps only
correct answers; the paper keeps the best whatever its reward, the default here).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import LossTerm, Method, best_of_group


class RAFTConfig(BaseModel):
    """RAFT's knobs. Read when ``algorithm: raft``."""

    model_config = ConfigDict(extra="forbid")

    min_reward: float | None = Field(None, description="Fine-tune on a group's best trajectory only when its reward is at least this (None: always, as in the paper).")


def _terms(cfg, params) -> list[LossTerm]:
    floor = cfg.section("raft").min_reward

    def rows(batch):
        keep = best_of_group(batch)  # Algorithm 1: the top-ranked sample of each prompt
        return keep if floor is None else keep & (batch.rewards >= floor)

    return [LossTerm("sft", cfg.learner.loss or "sft", params, rows=rows)]


#: The package as reflexdb loads it (its entry point names this object; reflexdb/plugins.py).
plugin = Plugin(name="raft", methods=(Method("raft", "RAFT: SFT on the best-rewarded trajectory of each group "
                                                     "(Dong et al., 2023)", "sft", config=RAFTConfig, terms=_terms),))
