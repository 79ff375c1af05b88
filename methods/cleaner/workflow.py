"""CLEANER's collection: tool-use episodes purified by SAAR (METHODS.md §5; CLEANER.md Sec. 4; docs/cleaner.md).

    claim:   tasks, as the plain group does (SKIP LOCKED, ``collector.max_collections``)
    collect: G episodes of each claimed task in the ``tool_python`` environment, SAAR on a share p
             of them (collector/saar.py: one engine call per turn for all episodes, corrections
             sampled beside the other episodes' turns)
      rescore  the purified episodes' behaviour log-probs recomputed under their purified context,
               one scoring call for all of them (CLEANER.md Sec. 4.3)
      groups   per task, written in one transaction: the training group (kind ``fresh``: each
               episode's purified trajectory, or its raw one when nothing was rolled back, the
               ``purifications`` rows as its attachment) and, when any episode was purified, a
               group of kind ``retry`` holding the raw twins (never trained; each purified row's
               ``parent_trajectory_id``)

Every row of the training group carries in ``meta``: ``saar`` (whether SAAR applied),
``tool_calls`` (its calls: status, seconds) and ``tool_errors`` (its failed tool turns), its raw
episode's ``raw_tool_calls`` and ``raw_tool_errors`` (tool turns and failed ones: a correction with
no block counts as a failed one), ``rollbacks``, ``recovered``, ``shallow``, ``deep``, ``runnable``
(some call ran), ``sandbox_calls`` and ``sandbox_s`` (every call the episode made, lookahead
included): the learner's ``cleaner/*`` metrics read them.
"""

from __future__ import annotations

from reflexdb import GroupIn, Sibling, TrajectoryIn, drill
from reflexdb.collector.environments import EnvTask
from reflexdb.collector.episodes import rescore
from reflexdb.collector.workflows.group import GroupWorkflow
from reflexdb.lazy import lazy

from .rollbacks import PurificationIn, Purifications
from .saar import SaarEpisode, SaarRollout

work = lazy("reflexdb.work")  # the store (SQLAlchemy) on first use: loading a plug-in stays cheap


def tool_counts(t: TrajectoryIn) -> tuple[int, int]:
    """(tool calls, failed ones) of a trajectory: its ``tool`` turns and those with ``tool_error``."""
    tools = [u for u in t.turns if u.role == "tool"]
    return len(tools), sum(u.tool_error for u in tools)


class CleanerWorkflow(GroupWorkflow):
    """Args:
        share: ``p``, the share of episodes that get SAAR (curriculum mixing; 1.0 default).
        max_attempts: ``K``, corrections per failed call (3).
        threshold: ``γ``, the similarity at or above which a replacement is shallow (0.5).
    """

    def __init__(self, ctx, *, share: float = 1.0, max_attempts: int = 3, threshold: float = 0.5):
        super().__init__(ctx)
        self.share, self.max_attempts, self.threshold = share, max_attempts, threshold

    def collect(self, claimed: list[work.ClaimedTask]) -> list[list[GroupIn]]:
        c = self.ctx
        drill.phase("generate")
        driver = c.driver(SaarRollout, share=self.share, max_attempts=self.max_attempts, threshold=self.threshold,
                          rng=c.rng)
        rows = driver.saar_episodes([EnvTask(t.id, t.prompt, t.ground_truth) for t in claimed],
                                    c.cfg.collector.group_size)
        built = [[self._trajectories(se) for se in row] for row in rows]
        drill.phase("rescore")
        purified = [p for row in built for _, p in row if p is not None]
        with c.timer("score"):
            rescore(c.engine, purified, c.cfg.collector.sampling.temperature or 1.0)
        return [self._groups(t, row, ses) for t, row, ses in zip(claimed, built, rows)]

    @staticmethod
    def _trajectories(se: SaarEpisode) -> tuple[TrajectoryIn, TrajectoryIn | None]:
        """(raw, purified or None): the episode as sampled and, when SAAR rolled something back,
        its purified trajectory (log-probs still to be rescored)."""
        raw = se.raw.trajectory()
        raw.origin = "raw"
        raw_calls, raw_errors = tool_counts(raw)
        meta = {"saar": se.saar, "raw_tool_calls": raw_calls, "raw_tool_errors": raw_errors,
                "rollbacks": len(se.rollbacks), "recovered": sum(r.recovered for r in se.rollbacks),
                "shallow": sum(r.replacement == "shallow" for r in se.rollbacks),
                "deep": sum(r.replacement == "deep" for r in se.rollbacks),
                "runnable": any(k["status"] == "ok" for k in se.calls), "sandbox_calls": len(se.calls),
                "sandbox_s": round(sum(k["seconds"] for k in se.calls), 4)}
        # tool_calls: every sandbox call of the raw episode (lookahead ones flagged); tool_errors: its failed tool turns
        raw.meta = {**raw.meta, **meta, "tool_calls": se.calls, "tool_errors": raw_errors, "logprobs_from": "sampled"}
        if not se.rollbacks:
            return raw, None
        pure = se.ep.trajectory()  # meta.tool_calls, tool_errors: the committed calls (the environment's)
        pure.origin = "purified"
        pure.meta = {**pure.meta, **meta}
        return raw, pure

    def _groups(self, task: work.ClaimedTask, built: list[tuple[TrajectoryIn, TrajectoryIn | None]],
                episodes: list[SaarEpisode]) -> list[GroupIn]:
        """The training group and (when an episode was purified) the raw twins' group, one transaction."""
        c = self.ctx
        train, twins, rows = [], [], []
        for (raw, pure), se in zip(built, episodes):
            if pure is None:
                train.append(raw)
                continue
            raw.embedding = None  # never trained: kept for inspection and lineage
            pure.parent_trajectory_id = Sibling(1, len(twins))
            twins.append(raw)
            prompt_turns = sum(u.token_start is None for u in pure.turns)
            rows += [PurificationIn(len(train), prompt_turns + r.turn, r) for r in se.rollbacks]
            train.append(pure)
        meta = {"saar_share": self.share, "n_saar": sum(se.saar for se in episodes), "n_purified": len(twins)}
        group = GroupIn(run_id=c.run_id, task_id=task.id, policy_version=c.version, trajectories=train,
                        workflow="cleaner", kind="fresh", collector=c.name, embedding_model=c.embedding_model,
                        embedding_layer=-1, meta=meta, attachments=[Purifications(tuple(rows))] if rows else [])
        if not twins:
            return [group]
        raws = GroupIn(run_id=c.run_id, task_id=task.id, policy_version=c.version, trajectories=twins,
                       workflow="cleaner", kind="retry", collector=c.name, embedding_model=c.embedding_model,
                       embedding_layer=-1, meta={"raw_twins_of": "purified"})
        return [group, raws]
