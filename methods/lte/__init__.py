"""LTE as a method (METHODS.md §2; LTE.md; docs/lte.md): hints from the model's own wrong answers.

- **workflows**: ``lte_hint`` first (hint stages of none-pass groups: hinted extra rollouts, the
  LTE group), then ``group``;
- **batch** (``select``): the oldest eligible groups, except that a none-pass group waits for its
  hint stage (at most ``hint_timeout_s``, then it is released and trains as it is) and a group
  whose stage wrote an LTE group is never taken: the LTE group trains in its place (stages.py);
  under ``unsolved: skip`` a group whose stage found nothing is never taken either, and is listed
  for admission control in ``Method.drops`` (view ``lte_group_drops``);
- **loss**: two terms (Eq. 8): the clipped GRPO surrogate on the on-policy rows with 1/Z
  (``agg: token-mean`` unless ``learner.loss_params`` says otherwise), and ``lte_shaped``
  (f(r') = r'/(r'+γ), no clip, 1/Z') on the hinted rows; advantages are the group's after
  replacement (the learner's group normalisation);
- **metrics**: ``lte/*`` (docs/metrics.md).

``mode: extra`` is the paper's GRPO_Extra: the same stage with the plain prompt; its correct extra
rollouts are on-policy rows of the first term.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import LossTerm, Method, WorkflowUse

from . import loss
from .workflow import LTEHintWorkflow



class LTEConfig(BaseModel):
    """LTE's knobs (METHODS.md §2, LTE.md Sec. 3; docs/lte.md). Read when ``algorithm: lte``."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["hint", "extra"] = Field("hint", description="'hint': LTE (extra rollouts under a hint built from the group's wrong answers); 'extra': the paper's GRPO_Extra baseline (extra rollouts with the plain prompt, no hint).")
    gamma: float = Field(0.1, gt=0.0, le=10.0, description="γ of the policy shaping f(r') = r'/(r' + γ) on hinted rows (Eq. 7).")
    denominator: Literal["one", "behaviour"] = Field("one", description="Ratio denominator of a hinted row: 'one' (the paper's experiments, App. C) or 'behaviour' (its log-prob under the hinted prompt, Eq. 6).")
    hint_timeout_s: float = Field(300.0, gt=0.0, le=86400.0, description="How long the learner holds a none-pass group for its hint stage; after that the group is released and trains as it is, and no collector starts its stage any more.")
    unsolved: Literal["train", "skip"] = Field("train", description="A none-pass group none of whose extra rollouts was correct: 'train' it as it is (zero advantages; loss terms such as a KL still act) or 'skip' it.")


def _cfg(cfg) -> LTEConfig:
    return cfg.section("lte")


def _workflows(cfg) -> list[WorkflowUse]:
    lte = _cfg(cfg)
    return [WorkflowUse("lte_hint", {"mode": lte.mode, "timeout_s": lte.hint_timeout_s}), WorkflowUse("group")]


def on_policy_rows(batch):
    """Rows of Eq. 8's second sum: every valid row that was not sampled under a hint."""
    return batch.valid & ~batch.of_origin("hinted")


def hinted_rows(batch):
    """Rows of Eq. 8's first sum: the valid hinted rollouts that replaced failures."""
    return batch.valid & batch.of_origin("hinted")


def _terms(cfg, main_params) -> list[LossTerm]:
    from .loss import LTEShapedParams

    lte = _cfg(cfg)
    if "agg" in type(main_params).model_fields and "agg" not in main_params.model_fields_set:
        main_params = main_params.model_copy(update={"agg": "token-mean"})  # Eq. 8: 1/Z Σ_i Σ_t
    return [LossTerm("policy", cfg.learner.loss or "grpo", main_params, rows=on_policy_rows),
            LossTerm("hinted", "lte_shaped", LTEShapedParams(gamma=lte.gamma, denominator=lte.denominator),
                     rows=hinted_rows)]


def _settings(cfg) -> dict:
    lte = _cfg(cfg)
    return {"lte.mode": lte.mode, "lte.hint_timeout_s": lte.hint_timeout_s, "lte.unsolved": lte.unsolved,
            "lte.gamma": lte.gamma, "lte.denominator": lte.denominator}


def _check(cfg) -> None:
    if cfg.collector.group_size < 2:
        raise ValueError(f"collector.group_size is {cfg.collector.group_size}; lte needs at least 2 "
                         "(advantages are normalised within a group)")


class LTEHooks:
    """LTE's learner side: the batch rule and the ``lte/*`` metrics."""

    def __init__(self, cfg, learner):
        self.cfg, self.lte, self.learner = cfg, _cfg(cfg), learner

    def select(self, n: int, min_version: int):
        from reflexdb.trainer.batch import Selection

        from . import stages as lte

        L = self.learner
        ids, snapshot, _ = lte.eligible_group_ids(L.store, L.run_id, n, min_version=min_version,
                                                  timeout_s=self.lte.hint_timeout_s,
                                                  train_unsolved=self.lte.unsolved == "train")
        return Selection(ids, snapshot)

    def metrics(self, batch, groups) -> dict[str, float]:
        """The paper's Fig. 4 (none/some/all-pass groups before and after hinting), the stages'
        outcomes and a pass@1 of the plain-prompt policy that hinting does not inflate."""
        import torch

        from . import stages as lte

        L = self.learner
        stages = L.db(lambda: lte.stages_of(L.store, [g.id for g in groups]))
        by_lte = {s.lte_group_id: s for s in stages if s.lte_group_id is not None}
        by_original = {s.group_id: s for s in stages}
        before, after = Counter(), Counter()
        for g in groups:
            c = sum(bool(t.correct) for t in g.trajectories)
            cls = "none" if c == 0 else "all" if c == len(g.trajectories) else "some"
            after[cls] += 1
            before["none" if g.id in by_lte else cls] += 1
        done = [by_lte.get(g.id) or by_original.get(g.id) for g in groups]
        done = [s for s in done if s is not None and s.status == "done"]
        m: dict[str, float] = {f"lte/{k}_pass_before": float(before[k]) for k in ("none", "some", "all")}
        m.update({f"lte/{k}_pass_after": float(after[k]) for k in ("none", "some", "all")})
        m["lte/lte_groups"] = float(len(by_lte))
        m["lte/released"] = float(sum(by_original.get(g.id) is not None and by_original[g.id].status == "released"
                                      for g in groups))
        m["lte/unsolved"] = float(sum(s.lte_group_id is None for s in done))
        sampled = sum(s.n_sampled or 0 for s in done)
        m["lte/hinted_success_rate"] = sum(s.n_correct or 0 for s in done) / sampled if sampled else float("nan")
        replaced = [s.n_correct for s in by_lte.values()]
        m["lte/replaced_per_group"] = sum(replaced) / len(replaced) if replaced else float("nan")
        m["lte/stage_latency_s"] = sum(s.latency_s for s in done) / len(done) if done else float("nan")
        for kind, k in Counter(s.hint_kind for s in done if s.hint_kind).items():
            m[f"lte/hint_kind/{kind}"] = float(k)
        # pass@1 of the plain-prompt policy: an LTE group counts as its original (G failures); the
        # extra rollouts that replaced some are left out (chosen for being correct).
        in_lte = torch.tensor([batch.group_kinds[int(i)] == "hinted" for i in batch.group_index], dtype=torch.bool)
        own = ~in_lte & ~batch.replayed & ~batch.of_origin("hinted")
        n = int(own.sum()) + int(in_lte.sum())
        m["reward/pass_at_1"] = float(batch.correct[own].sum()) / n if n else float("nan")
        return m


#: ``algorithm: lte``.
METHOD = Method(
    "lte", "LTE: hints from the model's own wrong answers, mixed-policy loss (LTE.md)", "grpo",
    config=LTEConfig, workflows=_workflows, terms=_terms, settings=_settings, check=_check, hooks=LTEHooks,
    # the groups LTE never trains (a stage that found nothing, under lte.unsolved: skip; LTE's branch,
    # lte_0004): collectors' admission control does not count them, as the batch rule never takes them
    drops="lte_group_drops",
)

#: The package as reflexdb loads it (its entry point names this object; reflexdb/plugins.py).
plugin = Plugin(
    name="lte",
    methods=(METHOD,),
    workflows={"lte_hint": LTEHintWorkflow},
    losses={"lte_shaped": loss.SPEC},
    sql=Path(__file__).parent / "sql",
    tables=f"{__name__}.tables",
    archived=(
        ("hints", "task_id IN (SELECT id FROM tasks WHERE run_id = %(run)s)", "id"),
        ("lte_stages", "run_id = %(run)s", "group_id"),
        ("trajectory_hints", "run_id = %(run)s", "trajectory_id"),
    ),
    # its branch's first revision split it out of the column trajectories.hint_id, and its downgrade puts the
    # links back there: dropping it loses nothing (reflexdb.migrate.RowsGuard)
    kept_by_downgrade=("trajectory_hints",),
    migrations=Path(__file__).parent / "migrations",
)
