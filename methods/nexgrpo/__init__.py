"""NexGRPO as a method (METHODS.md §3; docs/nexgrpo.md): gated negative replay of boundary failures.

- **workflows**: ``nexgrpo_replay`` first (fill the learner's replay requests: ``[y+, b*]`` and
  G − 2 fresh rollouts), then ``group`` with soft retirement (a retired task is drawn with
  probability ε when its turn comes);
- **batch**: the oldest eligible groups, at most ⌊α·B⌋ of them replay groups (``select``);
- **loss**: GRPO on every valid row; replayed stored rows use their behaviour log-probs as the
  ratio denominator (NexGRPO.md Eq. 7; the learner does this for any replayed row);
- **settings**: the gate, the difficulty σ, ε and α (the pool views read them);
- **after each step**: delayed start, then plan replay requests (``planner.py``);
- **metrics**: ``replay/*`` (docs/metrics.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import Method, WorkflowUse

from .workflow import ReplayWorkflow


if TYPE_CHECKING:
    from reflexdb.trainer.method_api import LearnerContext


class NexGRPOConfig(BaseModel):
    """NexGRPO's knobs (METHODS.md §3, NexGRPO.md Sec. 4; docs/nexgrpo.md). Read when ``algorithm: nexgrpo``."""

    model_config = ConfigDict(extra="forbid")

    conf_low: float = Field(0.2, ge=0.0, le=1.0, description="ℓ_low: an incorrect trajectory enters the negative pool only with confidence ≥ this (gate ends included).")
    conf_high: float = Field(0.9, ge=0.0, le=1.0, description="ℓ_high: ... and confidence ≤ this.")
    replay_ratio: float = Field(0.5, ge=0.0, le=1.0, description="α: replay groups per batch = min(⌊α·groups_per_step⌋, replayable tasks).")
    start_pass_at_1: float = Field(0.35, ge=0.0, le=1.0, description="Delayed start: replay begins once a batch's on-policy pass@1 exceeds this (and stays on).")
    retire_prob: float = Field(0.05, ge=0.0, le=1.0, description="ε: a retired task (latest group all correct) is drawn with this probability when its turn comes.")
    difficulty_sd: float = Field(1.0, gt=0.0, le=1000.0, description="σ of the difficulty weight N(k; n/2, σ) over tasks with k of n rollouts correct.")
    refresh: bool = Field(True, description="Confidence refresh: recompute b*'s confidence under the learner's weights and skip it when it left the gate.")
    refresh_candidates: int = Field(4, ge=1, le=1024, description="Most similar negatives the refresh tries per replay task before giving the task up for this step.")

    @model_validator(mode="after")
    def _gate(self) -> NexGRPOConfig:
        if self.conf_low > self.conf_high:
            raise ValueError(f"nexgrpo.conf_low ({self.conf_low}) must not exceed nexgrpo.conf_high ({self.conf_high})")
        return self


def _crossed(store, run_id: int, threshold: float) -> bool:
    """Whether a surviving step of the run had an on-policy pass@1 above ``threshold``."""
    return store.any_step_metric_above(run_id, "reward/pass_at_1", threshold)


def _check(cfg) -> None:
    if cfg.collector.group_size < 3:
        raise ValueError(f"collector.group_size is {cfg.collector.group_size}; nexgrpo needs at least 3 "
                         "(a replay group holds y+, b* and G - 2 fresh rollouts)")


def _workflows(cfg) -> list[WorkflowUse]:
    return [WorkflowUse("nexgrpo_replay"), WorkflowUse("group", {"retire_prob": cfg.section("nexgrpo").retire_prob,
                                                                   "retired": "nexgrpo_retired_tasks"})]


def _settings(cfg) -> dict:
    n = cfg.section("nexgrpo")
    return {"nexgrpo.conf_low": n.conf_low, "nexgrpo.conf_high": n.conf_high, "nexgrpo.difficulty_sd": n.difficulty_sd,
            "nexgrpo.retire_prob": n.retire_prob, "nexgrpo.replay_ratio": n.replay_ratio}


class ReplayHooks:
    """NexGRPO's learner side: the replay planner, the delayed start and the batch's replay quota."""

    def __init__(self, cfg, learner: LearnerContext):
        self.cfg, self.n, self.learner = cfg, cfg.section("nexgrpo"), learner
        self.active = False  # delayed start: set once a batch's pass@1 exceeds start_pass_at_1
        self.planner = None

    def setup(self) -> None:
        """The FAISS index and planner (rank 0); replay is on if a surviving step already crossed
        the delayed-start threshold (steps rolled back on resume no longer count)."""
        import numpy as np

        from reflexdb.index import EmbeddingIndex

        from .planner import ReplayPlanner

        L, n = self.learner, self.n
        if not L.main:
            return
        self.planner = ReplayPlanner(
            L.store, L.run_id, EmbeddingIndex.open(L.store, L.run_id, config=self.cfg.faiss), conf_low=n.conf_low,
            conf_high=n.conf_high, refresh=n.refresh, refresh_candidates=n.refresh_candidates,
            group_size=self.cfg.collector.group_size, rng=np.random.default_rng([self.cfg.seed, L.step_no]))
        self.active = L.db(lambda: _crossed(L.store, L.run_id, n.start_pass_at_1))
        if self.active:
            L.echo(f"nexgrpo: replay is on (a batch's pass@1 already exceeded {n.start_pass_at_1}); "
                   "planning replay requests")

    def select(self, n: int, min_version: int):
        from .batch import replay_selection
        from .planner import replay_quota

        L = self.learner
        return replay_selection(L.store, L.run_id, n, min_version=min_version,
                                max_replay=replay_quota(n, self.n.replay_ratio, n))

    def progress(self, metrics: dict[str, float]) -> str:
        return f"replay {metrics['replay/share']:.2f}" if "replay/share" in metrics else ""

    def metrics(self, batch, groups) -> dict[str, float]:
        replays = [g for g in groups if g.kind == "replay"]
        negatives = batch.replayed & ~batch.correct
        cosines = [float(g.meta["cosine"]) for g in replays if "cosine" in g.meta]
        return {
            "replay/share": len(replays) / len(groups),
            "replay/negative_confidence": (float(batch.confidence[negatives].nanmean()) if negatives.any()
                                           else float("nan")),
            "replay/pair_cosine": sum(cosines) / len(cosines) if cosines else float("nan"),
        }

    def after_step(self, metrics: dict[str, float]) -> None:
        """Switch replay on (delayed start), then keep d·⌊α·B⌋ replay tasks in flight (d = 2 when
        collectors may work ahead, i.e. max_staleness ≥ 1; docs/nexgrpo.md).

        Rank 0 plans and posts requests; the other ranks take part in the confidence-refresh
        forward passes (ZeRO-3 shards the weights) until rank 0 says it is done.
        """
        from . import requests as replay

        from .planner import replay_quota

        L, n = self.learner, self.n
        if not self.active and metrics.get("reward/pass_at_1", 0.0) > n.start_pass_at_1:
            self.active = True  # every rank sees the same batch, so every rank flips together
            L.echo(f"nexgrpo: batch pass@1 {metrics['reward/pass_at_1']:.3f} > {n.start_pass_at_1}: replay starts")
        if not self.active:
            out = {"replay/active": 0.0}
        elif L.main:
            B, depth = self.cfg.learner.groups_per_step, 1 + min(self.cfg.max_staleness, 1)
            with L.scorer.session():
                # With max_staleness ≥ 1 the collectors work a batch ahead: requests posted now are
                # filled while the learner trains on groups already written, and reach the batch
                # after next. Two batches' worth in flight lets every batch find its ⌊α·B⌋.
                stats = L.db(lambda: self.planner.plan(
                    lambda n_candidates: depth * replay_quota(B, n.replay_ratio, n_candidates), L.scorer.score,
                    step=L.step_no, version=L.version, min_version=L.version - self.cfg.max_staleness))
            out = {"replay/active": 1.0, **stats.metrics()}
        else:
            L.scorer.serve()
            return
        if L.main:
            out["replay/retired_tasks"] = float(L.db(lambda: replay.retired_count(L.store, L.run_id)))
            L.log_step_metrics({k: v for k, v in out.items() if math.isfinite(v)})


#: ``algorithm: nexgrpo``.
METHOD = Method(
    "nexgrpo", "NexGRPO: GRPO with gated replay of boundary failures (NexGRPO.md)", "grpo",
    config=NexGRPOConfig, workflows=_workflows, settings=_settings, check=_check, hooks=ReplayHooks,
)

#: The package as reflexdb loads it (its entry point names this object; reflexdb/plugins.py).
plugin = Plugin(
    name="nexgrpo",
    methods=(METHOD,),
    workflows={"nexgrpo_replay": ReplayWorkflow},
    sql=Path(__file__).parent / "sql",
    tables=f"{__name__}.tables",
    archived=(("replay_requests", "run_id = %(run)s", "id"),),
)
