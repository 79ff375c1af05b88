"""The method ``selfcheck``: the run's loss family on the answers (term ``policy``) and on the
verifications (term ``verify``, weighted by ``selfcheck.verify_weight``), each with its own
normaliser; its config section ``selfcheck:``; its metrics ``selfcheck/*``."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from reflexdb.trainer.method_api import LossTerm, Method, WorkflowUse

ORIGIN = "verification"


class SelfCheckConfig(BaseModel):
    """``selfcheck:`` in a run's YAML."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    verify_weight: float = Field(1.0, ge=0.0, le=100.0, description="Weight of the verify term (the verifications' loss) beside the answers' policy term; 0: verifications are stored but never trained.")
    max_tokens: int = Field(16, ge=1, le=512, description="The verifier's reply, at most this many tokens (its verdict is the first 'yes' or 'no').")


def _workflows(cfg) -> list[WorkflowUse]:
    return [WorkflowUse("selfcheck", {"max_tokens": cfg.section("selfcheck").max_tokens})]


def _answers(batch):
    return batch.valid & ~batch.of_origin(ORIGIN)


def _verifications(batch):
    return batch.valid & batch.of_origin(ORIGIN)


def _terms(cfg, params) -> list[LossTerm]:
    weight = cfg.section("selfcheck").verify_weight
    return [LossTerm("policy", cfg.loss_family, params, rows=_answers),
            LossTerm("verify", cfg.loss_family, params, rows=_verifications, weight=weight)]


class SelfCheckHooks:
    def __init__(self, cfg, learner):
        self.learner = learner

    def metrics(self, batch, groups) -> dict[str, float]:
        """The verifications of this step: how many, how often their verdict agreed."""
        v = _verifications(batch)
        n = int(v.sum())
        agreement = float(batch.rewards[v].mean()) if n else math.nan
        return {"selfcheck/verifications": float(n), "selfcheck/agreement": agreement}


METHOD = Method(
    "selfcheck", "Self-verification: the model checks its own answers and learns from whether it was right",
    "grpo", config=SelfCheckConfig, workflows=_workflows, terms=_terms,
    settings=lambda cfg: {"selfcheck.verify_weight": cfg.section("selfcheck").verify_weight},
    hooks=SelfCheckHooks)
