"""The plain group (GRPO and every method built on it): claim tasks, G samples each, score, group.

    claim:   tasks (SKIP LOCKED), each at most ``collector.max_collections`` times; with soft
             retirement (``retire_prob``: NexGRPO's ε), a retired task is kept with probability ε
    collect: G = ``collector.group_size`` episodes per task in the run's environment (one engine
             call per turn for all of them; ``single``: one call) -> rewards -> groups
"""

from __future__ import annotations

from reflexdb import GroupIn
from reflexdb.lazy import lazy

from ..environments import EnvTask
from . import register_workflow

work = lazy("reflexdb.work")  # the store (SQLAlchemy) on first use: loading a plug-in stays cheap


@register_workflow("group")
class GroupWorkflow:
    """The plain group: claim tasks, ``collector.group_size`` episodes of each in the run's
    environment, one group (kind ``fresh``) per task. A method's workflow may subclass it to keep
    the task claims and write its own ``collect`` (the selfcheck plug-in does).

    Args:
        ctx: the collector (``CollectContext``).
        retire_prob: soft retirement's ε (None: retirement ignored, every task drawn in turn).
        retired: under soft retirement, the view that lists the retired tasks (the method's).
    """

    def __init__(self, ctx, *, retire_prob: float | None = None, retired: str | None = None):
        self.ctx = ctx
        self.retire_prob, self.retired = retire_prob, retired
        self.retirement = work.RetirementDraws()

    def claim(self, want: int) -> list[work.ClaimedTask]:
        """Up to ``want`` tasks of the run (``FOR UPDATE SKIP LOCKED``), each claimed for this collector."""
        c, C = self.ctx, self.ctx.cfg.collector
        return c.db(lambda: work.claim_tasks(
            c.store, c.run_id, c.name, want, max_collections=C.max_collections or 2**31 - 1,
            claim_ttl_s=C.claim_ttl_s, retire_prob=self.retire_prob, retired=self.retired, rng=c.rng, draws=self.retirement))

    def collect(self, claimed: list[work.ClaimedTask]) -> list[GroupIn]:
        """One group of ``collector.group_size`` scored episodes per claimed task."""
        c = self.ctx
        episodes = c.rollout([EnvTask(t.id, t.prompt, t.ground_truth) for t in claimed], c.cfg.collector.group_size)
        return [GroupIn(run_id=c.run_id, task_id=t.id, policy_version=c.version, trajectories=batch,
                        workflow="group", kind="fresh", collector=c.name, embedding_model=c.embedding_model,
                        embedding_layer=-1)
                for t, batch in zip(claimed, episodes)]

    def release(self) -> None:
        """Give back this collector's unfinished task claims."""
        work.release_claims(self.ctx.store, self.ctx.run_id, self.ctx.name)

    def exhausted(self) -> bool:
        """Every task was collected ``max_collections`` times (never, without a limit)."""
        c = self.ctx
        limit = c.cfg.collector.max_collections
        return limit is not None and c.db(lambda: work.tasks_left(c.store, c.run_id, limit)) == 0
