"""LTE's hint stage (METHODS.md §2; LTE.md Sec. 3.1, Appendix B): hinted extra rollouts for
none-pass groups, and the LTE group that trains instead of the original.

    claim:   hint stages of none-pass groups (view lte_hint_pool -> table lte_stages; SKIP LOCKED,
             TTL), never one whose group timed out (``timeout_s``: the learner has it then)
    collect: for each, the hint of the pool's kind with the group's wrong answers
             (collector/tasks/hints.py), G extra rollouts (episodes of the run's environment)
             under the hinted prompt; the G' correct ones replace G' randomly chosen failed
             originals (App. B) in a group of kind ``hinted`` at the original's policy version:
             replayed copies of the kept originals (origin ``replayed``) and the hinted rollouts
             (origin ``hinted``, lineage to the hint and to the rollout each replaced; their
             behaviour log-probs are those under the hint, their prompt ids the plain prompt's).
             The hints row, the group and the stage's completion are one transaction. With G' = 0
             only the hints row and the stage's end are written: the original trains as it is.

``mode: extra`` is the paper's GRPO_Extra baseline: the same stage with the plain prompt (no hint,
no hints row); correct extra rollouts are on-policy samples (origin ``base``) replacing failures.
"""

from __future__ import annotations

import time

import numpy as np

from reflexdb import GroupIn, Trajectory, TrajectoryIn, TurnIn, drill
from reflexdb.collector.environments import EnvTask
from reflexdb.collector.workflows.base import replayed_copy
from reflexdb.errors import ClaimLost

from . import stages as lte
from .hints import hinted_question
from .stages import ClaimedStage, HintIn, LteStageIn

MODES = ("hint", "extra")


class LTEHintWorkflow:
    """Args:
        mode: ``hint`` (LTE) or ``extra`` (GRPO_Extra: plain prompt).
        timeout_s: a none-pass group older than this is the learner's (``lte.hint_timeout_s``).
    """

    #: A stage replaces a group that was admitted when it was written: it never waits for admission
    #: control (the learner may be waiting for it; collector/runner.py).
    admission_free = True

    def __init__(self, ctx, *, mode: str = "hint", timeout_s: float = 300.0):
        if mode not in MODES:
            raise ValueError(f"lte_hint: mode {mode!r} is not one of {', '.join(MODES)}")
        self.ctx, self.mode, self.timeout_s = ctx, mode, float(timeout_s)

    def claim(self, want: int) -> list[ClaimedStage]:
        c = self.ctx

        def claim() -> list[ClaimedStage]:
            latest = c.store.latest_policy(c.run_id)
            min_version = (latest.version if latest else 0) - c.cfg.max_staleness
            return lte.claim_stages(c.store, c.run_id, c.name, want, min_version=min_version,
                                    timeout_s=self.timeout_s, claim_ttl_s=c.cfg.collector.claim_ttl_s)

        return c.db(claim)

    def collect(self, stages: list[ClaimedStage]) -> list[GroupIn]:
        c = self.ctx
        t0 = time.monotonic()
        drill.phase("hint")  # a drill (or the kill test) stops a collector here, holding its claims
        originals = {g.id: g for g in c.db(lambda: c.store.read_groups([s.group_id for s in stages]))}
        prompts = [s.prompt if self.mode == "extra" else hinted_question(s.prompt, s.hint_kind, s.wrong_answers)
                   for s in stages]
        G = c.cfg.collector.group_size
        episodes = c.rollout([EnvTask(s.task_id, p, s.ground_truth) for s, p in zip(stages, prompts)], G)
        groups = []
        for s, prompt, extra in zip(stages, prompts, episodes):
            hint = None
            if self.mode == "hint":
                hint = HintIn(c.db(lambda: lte.reserve_hint_id(c.store)), s.hint_kind, s.wrong_answers,
                              c.prompt(prompt)[-1]["content"])
            original = originals[s.group_id]
            correct = [t for t in extra if t.correct][: len(original.trajectories)]
            stage = LteStageIn(s.group_id, s.task_id, self.mode, hint, len(extra), len(correct))
            if not correct:  # the group stays none-pass: it trains as it is (or is skipped, per lte.unsolved)
                try:
                    c.db(lambda stage=stage: lte.finish_unsolved(c.store, stage, c.name))
                except ClaimLost as exc:
                    c.echo(str(exc))
                continue
            groups.append(lte_group(original, correct, stage, rng=c.rng, collector=c.name,
                                    embedding_model=c.embedding_model,
                                    meta={"stage_seconds": round(time.monotonic() - t0, 3)}))
        return groups

    def release(self) -> None:
        lte.release_stages(self.ctx.store, self.ctx.run_id, self.ctx.name)


def lte_group(original, correct: list[TrajectoryIn], stage: LteStageIn, *, rng: np.random.Generator,
              collector: str | None = None, embedding_model: str = "unknown", meta: dict | None = None) -> GroupIn:
    """The LTE group of a none-pass ``original`` group (read with payloads and turns): the G' =
    ``len(correct)`` correct extra rollouts replace G' of its failures chosen uniformly at random
    (LTE.md Appendix B), at the same positions; the rest are replayed copies. The group carries
    the original's policy version (staleness and admission count it there) and finishes ``stage``.
    """
    members = original.trajectories
    if not 0 < len(correct) <= len(members):
        raise ValueError(f"group {original.id}: {len(correct)} replacements for {len(members)} rollouts")
    replaced = sorted(int(i) for i in rng.choice(len(members), size=len(correct), replace=False))
    out = [replayed_copy(t) for t in members]
    for pos, new in zip(replaced, correct):
        out[pos] = as_replacement(new, members[pos], stage)
    return GroupIn(
        run_id=original.run_id, task_id=original.task_id, policy_version=original.policy_version,
        trajectories=out, workflow="lte", kind="hinted", collector=collector, embedding_model=embedding_model,
        attachments=[stage],
        meta={"original_group_id": original.id, "mode": stage.mode, "replaced": replaced,
              "hint_kind": stage.hint.kind if stage.hint else None, **(meta or {})},
    )


def as_replacement(new: TrajectoryIn, replaced: Trajectory, stage: LteStageIn) -> TrajectoryIn:
    """An extra rollout as the member that replaces ``replaced``: its prompt ids and prompt turns
    become the plain prompt's (π_θ(o'|q) is trained on the plain prompt, LTE.md Eq. 6); its
    tokens, behaviour log-probs (under the hint) and own turns stay; lineage to the rollout it
    replaced (its hint: a row of ``trajectory_hints``, written by the stage's attachment)."""
    n_prompt = sum(1 for u in new.turns if u.token_start is None and u.role != "assistant")
    plain = [TurnIn(u.role, u.text) for u in replaced.turns if u.token_start is None and u.role != "assistant"]
    hinted = stage.hint is not None
    new.prompt_ids = replaced.prompt_ids
    new.turns = plain + list(new.turns[n_prompt:])
    new.origin = "hinted" if hinted else "base"
    new.parent_trajectory_id = replaced.id
    new.meta = {**(new.meta or {}), "replaced": replaced.id}
    return new
