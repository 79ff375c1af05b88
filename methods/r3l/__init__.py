"""R3L as a method (METHODS.md §1; R3L.md; docs/r3l.md): reflect-then-retry, pivotal credit,
positive amplification.

- **workflow**: ``r3l`` (collector/workflows/r3l.py): exploration groups of N/2 base episodes and
  their distilled twins, with every reflection and guided retry, written together;
- **batch** (``select``): the oldest eligible exploration groups (view ``learner_eligible``; the
  retry groups are never eligible as groups), and beside them up to ``reflect_per_step`` and
  ``retry_per_step`` pairs of the SFT sets (views ``r3l_reflect_set``, ``r3l_retry_set``: verified
  corrections, each trained at most ``sft_max_uses`` times);
- **advantages**: group-normalised over base ∪ distilled (Eq. 4), then positive amplification
  (Eq. 11; ``amplification: false`` for the ablation);
- **loss** (Eq. 12): three terms, each with its own normaliser and weight:
    ``policy``   −Â·log π_θ (``opmd``: no ratio, no KL), ``seq-mean-token-mean``: 1/|G| Σ_τ 1/|τ| Σ,
                 over the exploration rows, the pivotal mask applied (Eq. 10; ``pivot_mask: false``
                 for the ablation)
    ``reflect``  NLL on the reflect set's reflections (token mean), weight ``reflect_weight``
    ``retry``    NLL on the retry set's suffixes (token mean), weight ``retry_weight``;
- **metrics**: ``r3l/*`` (docs/metrics.md).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import LossTerm, Method, WorkflowUse

from .workflow import R3LWorkflow


#: Origins of the SFT rows (reflexdb/origins.py): never rows of the policy-gradient term.
SFT_ORIGINS = ("reflection", "guided_retry")


class R3LConfig(BaseModel):
    """R3L's knobs (METHODS.md §1, R3L.md Sec. 4; docs/r3l.md). Read when ``algorithm: r3l``."""

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(3.0, gt=0.0, le=100.0, description="α of positive amplification (Eq. 11): Â = α·A where A > 0.")
    max_reward: float = Field(1.0, description="R_max of Eq. 11: the maximum attainable reward; a trajectory with r ≥ R_max gets the fixed advantage (the authors' code tests r ≥ 1). Not the group's maximum, which would promote the failures of an all-failed group.")
    max_reward_advantage: Literal["alpha", "one"] = Field("alpha", description="Â of a trajectory at R_max: 'alpha' (the paper's Eq. 11) or 'one' (1.0, the authors' code).")
    amplification: bool = Field(True, description="Positive amplification on (Eq. 11); false: Â = A (the paper's 'w/o Positive Amplification' ablation).")
    pivot_mask: bool = Field(True, description="Pivotal credit assignment on (Eq. 10): no loss on the turns before the pivot of a base episode with a distilled twin, and of the twin; false: the ablation.")
    temperature: float = Field(0.7, gt=0.0, le=2.0, description="Sampling temperature of the reflections (0.7 in the paper).")
    max_tokens: int = Field(384, ge=16, le=8192, description="Most tokens of a reflection.")
    decoding: Literal["free", "json_schema"] = Field("free", description="How reflections are sampled: 'free' (the paper) or 'json_schema' (constrained to the reflection's JSON schema by a grammar engine: xgrammar on the HF engine, SGLang's own on SGLang). Reflections are trained by SFT only, never by the policy gradient, so constraining them does not bias the RL loss.")
    max_chars: int = Field(400, ge=16, le=20000, description="Under decoding 'json_schema': the longest text a reflection's text field may hold.")
    reflect_weight: float = Field(1.0, ge=0.0, le=100.0, description="Weight of the SFT term on the reflect set (Eq. 12's L_SFT on D_reflect); 0 turns it off.")
    retry_weight: float = Field(1.0, ge=0.0, le=100.0, description="Weight of the SFT term on the retry set (Eq. 12's L_SFT on D_retry); 0 turns it off.")
    reflect_per_step: int = Field(8, ge=0, le=4096, description="Most reflect-set pairs a learner step takes (the oldest available).")
    retry_per_step: int = Field(8, ge=0, le=4096, description="Most retry-set pairs a learner step takes (the oldest available).")
    sft_max_uses: int = Field(1, ge=1, le=1000, description="Times each SFT pair may be trained (views r3l_reflect_set, r3l_retry_set: column available).")
    guidance: Literal["reflection", "oracle"] = Field("reflection", description="What guides a retry: 'reflection' (the paper: the policy's own reflection, retried when it names a failure) or 'oracle', a diagnostic arm, never the method: every base episode that is not correct is retried from its first turn with a guidance built from the task's ground truth (stored in the guidance turn, rows marked meta.guidance = 'oracle'), so that retries succeed and the distillation path (twins re-scored under the plain context, amplification, the retry SFT set) is exercised whatever the model's reflections are worth. The policy still reflects and its reflections are stored and parsed as usual; the reflect set is not trained under it (the retries' success is the oracle's, not the reflection's).")


def _cfg(cfg) -> R3LConfig:
    return cfg.section("r3l")


def _workflows(cfg) -> list[WorkflowUse]:
    r = _cfg(cfg)
    return [WorkflowUse("r3l", {"temperature": r.temperature, "max_tokens": r.max_tokens, "decoding": r.decoding,
                                "max_chars": r.max_chars, "guidance": r.guidance})]


def exploration_rows(batch):
    """Rows of Eq. 12's policy-gradient sum: the exploration groups' base and distilled episodes."""
    return batch.valid & ~batch.of_origin(*SFT_ORIGINS)


def reflect_rows(batch):
    """Rows of the reflect set (the reflections' own trajectories)."""
    return batch.valid & batch.of_origin("reflection")


def retry_rows(batch):
    """Rows of the retry set (the guided retries)."""
    return batch.valid & batch.of_origin("guided_retry")


def pivot_tokens(batch):
    """``[B, T]`` bool: Eq. 10's mask from each row's ``meta.pivot_token`` (0: nothing masked)."""
    import torch

    from .loss import pivotal_mask

    starts = torch.tensor([int((m or {}).get("pivot_token") or 0) for m in batch.meta], dtype=torch.int64)
    return pivotal_mask(batch.response_mask, starts)


def _terms(cfg, main_params) -> list[LossTerm]:
    from reflexdb.trainer.losses.sft import SFTParams

    r = _cfg(cfg)
    terms = [LossTerm("policy", cfg.learner.loss or "opmd", main_params, rows=exploration_rows,
                      mask=pivot_tokens if r.pivot_mask else None)]
    if r.reflect_weight > 0 and r.guidance == "reflection":
        terms.append(LossTerm("reflect", "sft", SFTParams(), rows=reflect_rows, weight=r.reflect_weight))
    if r.retry_weight > 0:
        terms.append(LossTerm("retry", "sft", SFTParams(), rows=retry_rows, weight=r.retry_weight))
    return terms


def _transforms(cfg) -> list:
    from reflexdb.trainer.advantages import make_transform

    r = _cfg(cfg)
    if not r.amplification:
        return []
    top = "alpha" if r.max_reward_advantage == "alpha" else 1.0
    return [make_transform("positive_amplification", alpha=r.alpha, max_reward=r.max_reward,
                           max_reward_advantage=top)]


def _settings(cfg) -> dict:
    r = _cfg(cfg)
    return {"r3l.sft_max_uses": r.sft_max_uses, "r3l.decoding": r.decoding, "r3l.alpha": r.alpha,
            "r3l.guidance": r.guidance}


def _check(cfg) -> None:
    G = cfg.collector.group_size
    if G < 2 or G % 2:
        raise ValueError(f"collector.group_size is {G}; r3l needs an even N >= 2 (N/2 base episodes, each with a "
                         "distilled twin or a filling base episode)")


class R3LHooks:
    """R3L's learner side: the batch (exploration groups and SFT pairs) and the ``r3l/*`` metrics."""

    def __init__(self, cfg, learner):
        self.cfg, self.r, self.learner = cfg, _cfg(cfg), learner

    def select(self, n: int, min_version: int):
        from reflexdb.trainer.batch import Selection, eligible_group_ids

        from . import reflections as r3l

        L, r = self.learner, self.r
        chosen = eligible_group_ids(L.store, L.run_id, n, min_version=min_version)
        if len(chosen.group_ids) < n:  # the learner waits for more groups; the pairs are chosen then
            return chosen
        extra = []
        if r.reflect_weight > 0 and r.guidance == "reflection":  # oracle: the retry's success is not the reflection's
            extra += r3l.sft_pairs(L.store, L.run_id, "r3l_reflect_set", r.reflect_per_step)
        if r.retry_weight > 0:
            extra += r3l.sft_pairs(L.store, L.run_id, "r3l_retry_set", r.retry_per_step)
        return Selection(chosen.group_ids, chosen.snapshot, extra)

    def metrics(self, batch, groups) -> dict[str, float]:
        """The paper's exploration metrics (Sec. 5.4, Fig. 3, Table 3) over this batch's exploration
        groups, the reflections' validity and outcomes, and the SFT sets."""
        from . import reflections as r3l

        L = self.learner
        nan = float("nan")
        stats = L.db(lambda: r3l.reflections_of(L.store, [g.id for g in groups]))
        valid = [s for s in stats if s.valid]
        retried = [s for s in stats if s.retried]
        pairs = [s for s in retried if s.retry_reward is not None and s.base_reward is not None]
        m: dict[str, float] = {"r3l/reflections": float(len(stats)), "r3l/retries": float(len(retried))}
        m["r3l/invalid_rate"] = 1.0 - len(valid) / len(stats) if stats else nan
        outcomes = Counter(s.outcome for s in valid)
        for o in r3l.OUTCOMES:
            m[f"r3l/outcome/{o}"] = outcomes[o] / len(valid) if valid else nan
        # the turn each retry started from: the reflection's pivot, or 0 under the oracle, whose
        # retries start from turn 0 whatever the reflection said (its pivot may be None: invalid)
        starts = [0 if self.r.guidance == "oracle" else s.pivot for s in retried]
        starts = [p for p in starts if p is not None]
        m["r3l/pivot_mean"] = sum(starts) / len(starts) if starts else nan
        m["r3l/retry_improvement_rate"] = (sum(s.retry_reward > s.base_reward for s in pairs) / len(pairs)
                                           if pairs else nan)
        m.update(reward_gain(stats))
        explore = [g for g in groups if g.kind != "retry"]
        twins = [sum(t.origin == "distilled" for t in g.trajectories) for g in explore]
        m["r3l/distilled_per_group"] = sum(twins) / len(twins) if twins else nan
        m["r3l/sft_reflect_rows"] = float(int(batch.of_origin("reflection").sum()))
        m["r3l/sft_retry_rows"] = float(int(batch.of_origin("guided_retry").sum()))
        sizes = L.db(lambda: r3l.set_sizes(L.store, L.run_id))
        m["r3l/reflect_set_size"], m["r3l/retry_set_size"] = float(sizes[0]), float(sizes[1])
        m["r3l/reflect_set_available"], m["r3l/retry_set_available"] = float(sizes[2]), float(sizes[3])
        return m


def reward_gain(stats) -> dict[str, float]:
    """The retries' reward gain over their own base episodes (Fig. 3a), paired: only the reflected
    episodes whose retry ran, each retry against its own base. Averaging the base reward over every
    reflected episode (those whose reflection said success or was invalid, and got no retry,
    included) and the retry reward over the retries only, as this did before issue 37, reported a
    gain where there was none (+0.50 on a group where each retry equalled its base).

    ``r3l/reward_gain``: mean of R(retry) − R(base) over the pairs; ``r3l/reward_gain_relative``: the
    same over the pairs' mean base reward (NaN while it is 0); ``r3l/base_reward_mean`` and
    ``r3l/retry_reward_mean`` over the pairs; ``r3l/reward_gain_pairs``: how many;
    ``r3l/reflected_base_reward_mean``: the base reward of every reflected episode."""
    nan = float("nan")
    pairs = [(s.base_reward, s.retry_reward) for s in stats
             if s.retried and s.retry_reward is not None and s.base_reward is not None]
    reflected = [s.base_reward for s in stats if s.base_reward is not None]
    base = sum(b for b, _ in pairs) / len(pairs) if pairs else nan
    retry = sum(r for _, r in pairs) / len(pairs) if pairs else nan
    return {
        "r3l/reward_gain_pairs": float(len(pairs)),
        "r3l/base_reward_mean": base,
        "r3l/retry_reward_mean": retry,
        "r3l/reward_gain": sum(r - b for b, r in pairs) / len(pairs) if pairs else nan,
        "r3l/reward_gain_relative": (retry - base) / base if pairs and base else nan,
        "r3l/reflected_base_reward_mean": sum(reflected) / len(reflected) if reflected else nan,
    }


#: ``algorithm: r3l``.
METHOD = Method(
    "r3l", "R3L: reflect-then-retry, pivotal credit, positive amplification (R3L.md)", "opmd",
    config=R3LConfig, workflows=_workflows, terms=_terms, transforms=_transforms, settings=_settings,
    check=_check, hooks=R3LHooks,
)

#: The package as reflexdb loads it (its entry point names this object; reflexdb/plugins.py).
plugin = Plugin(
    name="r3l",
    methods=(METHOD,),
    workflows={"r3l": R3LWorkflow},
    sql=Path(__file__).parent / "sql",
    tables=f"{__name__}.tables",
    archived=(
        ("reflections", "run_id = %(run)s", "id"),
        ("trajectory_reflections", "run_id = %(run)s", "trajectory_id"),
    ),
    # its branch's first revision split it out of the column trajectories.reflection_id, and its downgrade puts the
    # links back there: dropping it loses nothing (reflexdb.migrate.RowsGuard)
    kept_by_downgrade=("trajectory_reflections",),
    migrations=Path(__file__).parent / "migrations",
)
