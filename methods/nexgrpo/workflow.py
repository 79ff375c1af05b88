"""NexGRPO's replay groups (METHODS.md §3; NexGRPO.md Sec. 4.2): fill the learner's replay requests.

    claim:   replay requests (SKIP LOCKED), posted by the learner's planner
    collect: for each, G − 2 fresh rollouts (episodes of the run's environment) of the current policy, and the replay group
             [y+, b*, fresh...]: y+ and b* are stored trajectories replayed with their behaviour
             log-probs (origin ``replayed``, lineage to the original); the request is completed
             in the group's transaction (its attachment ``replay.RequestClaim``)
A request whose trajectories were deleted since is cancelled.
"""

from __future__ import annotations

from reflexdb import GroupIn, Trajectory, TrajectoryIn
from reflexdb.collector.environments import EnvTask
from reflexdb.collector.workflows.base import replayed_copy
from reflexdb.errors import NotFound

from . import requests as replay
from .requests import ReplayRequest


class ReplayWorkflow:
    def __init__(self, ctx):
        self.ctx = ctx

    def claim(self, want: int) -> list[ReplayRequest]:
        c = self.ctx
        return c.db(lambda: replay.claim_requests(c.store, c.run_id, c.name, want,
                                                  claim_ttl_s=c.cfg.collector.claim_ttl_s))

    def collect(self, requests: list[ReplayRequest]) -> list[GroupIn]:
        c = self.ctx
        n = max(r.group_size for r in requests) - 2
        episodes = (c.rollout([EnvTask(r.task_id, r.prompt, r.ground_truth) for r in requests], n) if n > 0
                    else [[] for _ in requests])
        groups = []
        for r, batch in zip(requests, episodes):
            try:
                positive, negative = c.db(lambda r=r: c.store.read_trajectories([r.positive_id, r.negative_id]))
            except NotFound as exc:  # deleted since the learner planned it: nothing to replay
                c.echo(f"replay request {r.id} cancelled: {exc}")
                c.db(lambda r=r: replay.cancel_request(c.store, r.id))
                continue
            fresh = batch[: r.group_size - 2]
            groups.append(replay_group(r, positive, negative, fresh, policy_version=c.version, collector=c.name,
                                       embedding_model=c.embedding_model))
        return groups

    def release(self) -> None:
        replay.release_requests(self.ctx.store, self.ctx.run_id, self.ctx.name)

    def in_flight(self) -> int:
        """Replay groups other collectors are making (their live claims): admission counts them."""
        c = self.ctx
        return replay.claimed_by_others(c.store, c.run_id, c.name, claim_ttl_s=c.cfg.collector.claim_ttl_s)


def replay_group(request: ReplayRequest, positive: Trajectory, negative: Trajectory, fresh: list[TrajectoryIn], *,
                 policy_version: int, collector: str | None = None, embedding_model: str = "unknown") -> GroupIn:
    """The replay group of ``request``: ``[y+, b*, *fresh]`` (``fresh`` are G − 2 new rollouts)."""
    if (positive.id, negative.id) != (request.positive_id, request.negative_id):
        raise ValueError(f"request {request.id} replays {request.positive_id} and {request.negative_id}, "
                         f"got {positive.id} and {negative.id}")
    return GroupIn(
        run_id=request.run_id, task_id=request.task_id, policy_version=policy_version,
        trajectories=[replayed_copy(positive), replayed_copy(negative), *fresh],
        workflow="nexgrpo", kind="replay", collector=collector, embedding_model=embedding_model,
        attachments=[replay.RequestClaim(request.id)],
        meta={"replay_request_id": request.id, "positive_id": positive.id, "negative_id": negative.id,
              "cosine": float(request.cosine), "learner_step": request.learner_step},
    )


