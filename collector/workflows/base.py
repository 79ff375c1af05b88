"""What a collection workflow is, and what the collector offers it.

A workflow is a small class::

    @register_workflow("my_workflow")
    class MyWorkflow:
        def __init__(self, ctx: CollectContext, **options): ...
        def claim(self, want: int) -> list: ...            # claim up to `want` items of work; [] = none now
        def collect(self, items: list) -> list[GroupIn | list[GroupIn]]: ...  # turn them into complete groups
        def release(self) -> None: ...                    # stop: give back unfinished claims
        def exhausted(self) -> bool: ...                  # no work will ever come again

A workflow whose work only replaces groups already admitted (LTE's hint stages) sets the class
attribute ``admission_free = True``: the collector runs it even while admission control holds new
groups back.

The collector writes each returned group in one transaction, and each returned *list* of groups
(a method's groups that belong together, such as R3L's exploration group and the group of its
reflections and retries) in one transaction; the work item a group completes (its task's claim,
or an attachment: ``reflexdb/attachments.py``) is completed in that transaction. The collector
keeps the statistics; a workflow never writes groups itself. ``release`` and ``exhausted`` are
optional.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from reflexdb import GroupIn, Store, Trajectory, TrajectoryIn
    from reflexdb.config import Config
    from reflexdb.timing import PhaseTimer

    from ..engines import Engine, Sample
    from ..environments import EnvTask, Environment
    from ..episodes import Episode, Rollout, Start


def score_samples(reward_fn, ground_truth: str | None, prompt: list[dict], samples: list[Sample]) -> list[TrajectoryIn]:
    """Samples as trajectories with their rewards and turns. A reward function that raises gives a
    NULL reward and the error on the row (``error``), never a crash: a user's reward function
    must not stop a collector."""
    from reflexdb import TrajectoryIn, TurnIn

    from ..environments.base import judge

    out = []
    for s in samples:
        reward, correct, answer, error = judge(reward_fn, s.text, ground_truth)
        turns = [TurnIn(m["role"], m["content"]) for m in prompt]
        turns.append(TurnIn("assistant", s.text, 0, len(s.token_ids)))
        out.append(TrajectoryIn(
            prompt_ids=s.prompt_ids, response_ids=s.token_ids, logprobs=s.logprobs, reward=reward,
            correct=correct, turns=turns, finish_reason=s.finish_reason, extracted_answer=answer,
            embedding=s.embedding, error=error,
            meta={} if s.call is None else {"generations": [s.call.record(None, len(s.token_ids))]}))
    return out


class CollectContext(Protocol):
    """What a workflow may use of its collector (``collector/runner.py``)."""

    cfg: Config
    store: Store
    run_id: int
    name: str  # the collector's name: claims are held under it
    engine: Engine
    version: int  # the policy version currently loaded
    embedding_model: str
    rng: np.random.Generator
    timer: PhaseTimer  # where the time goes: ``with c.timer("score"):`` around a workflow's own scoring pass

    def make_env(self, task: EnvTask) -> Environment: ...  # a fresh episode of the run's environment

    def db(self, fn) -> Any: ...  # a database call, retried through an outage (collector.db_retry_s)

    def echo(self, msg: str) -> None: ...  # a line of the collector's log

    def prompt(self, text: str) -> list[dict]: ...  # the chat messages of a task prompt (the run's template)

    def rollout(self, tasks: list[EnvTask], n: int) -> list[list[TrajectoryIn]]: ...  # n scored episodes each

    def episodes(self, tasks: list[EnvTask], n: int) -> list[list[Episode]]: ...  # ... with their environments

    def resume(self, starts: list[Start]) -> list[Episode]: ...  # episodes from restored environments, batched

    def driver(self, cls: type[Rollout] = ..., **options) -> Rollout: ...  # the rollout driver (or a subclass: a method's turn loop)

    def sample(self, prompts: list, n: int, **overrides) -> list[list[Sample]]: ...  # n samples each, seeded

    def score(self, ground_truth: str | None, prompt: list[dict], samples: list[Sample]) -> list[TrajectoryIn]:
        """``samples`` of ``prompt`` as trajectories with their rewards and turns (a reward function
        that raises gives a NULL reward and the error on the row)."""


class Workflow(Protocol):
    """What a collector asks of a workflow: ``claim`` work, ``collect`` it into groups. Optional,
    found with ``hasattr``: ``release()`` (give back this collector's claims: on stop, and after a
    refused write), ``exhausted()`` (no work will come), ``in_flight()`` (groups other collectors
    are making from this workflow's own claims, which admission control counts with the task
    claims), ``admission_free`` (its groups are not on-policy groups the learner counts)."""

    name: str

    def claim(self, want: int) -> list:
        """Claim up to ``want`` items of work for this collector (tasks, a method's requests); ``[]``:
        none now (the collector asks the next workflow, then waits)."""

    def collect(self, items: list) -> list[GroupIn | list[GroupIn]]:
        """Turn claimed items into complete groups. Each group is written in one transaction, each
        list of groups in one transaction together (``Sibling`` refers across them)."""


def replayed_copy(original: Trajectory) -> TrajectoryIn:
    """A stored trajectory as a member of a replay group: same tokens, behaviour log-probs, reward
    and turns; origin ``replayed``, lineage to the original. No embedding: the original's vector
    already represents it (the pools and the FAISS index leave replayed copies out).

    Raises:
        ValueError: ``original`` was read without payloads.
    """
    if original.response_ids is None:
        raise ValueError(f"trajectory {original.id} was read without its token payload")
    from reflexdb import TrajectoryIn, TurnIn

    return TrajectoryIn(
        prompt_ids=original.prompt_ids,
        response_ids=original.response_ids,
        logprobs=original.logprobs,
        reward=original.reward,
        correct=original.correct,
        turns=[TurnIn(u.role, u.text, u.token_start, u.token_end, u.trainable, u.tool_error, u.attempt, u.answer,
                      u.correct, u.reward, u.tool_call) for u in original.turns],
        truncated=original.truncated,
        finish_reason=original.finish_reason,
        extracted_answer=original.extracted_answer,
        confidence=original.confidence,
        origin="replayed",
        parent_trajectory_id=original.id,
        policy_version=original.policy_version,
        token_policy_versions=original.token_policy_versions,
        loss_mask=original.loss_mask,
        meta={"replayed_from": original.id},
    )
