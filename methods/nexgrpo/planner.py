"""NexGRPO's learner side: choosing replay tasks, anchors and boundary failures (METHODS.md §3).

Per learner step, once replay has started (delayed start: a batch's on-policy pass@1 exceeded
``start_pass_at_1``), the learner keeps ``min(⌊α·B⌋, |E|)`` replay tasks in flight::

    E       = view nexgrpo_replay_candidates (both pools non-empty), minus tasks already requested
    tasks   = weighted draw without replacement, weight N(k; n/2, σ)        (ExGRPO bucketing)
    y+      = uniform from the task's positive pool                          (NexGRPO Sec. 4.2)
    b*      = argmax_{b ∈ N_q} cos(φ(y+), φ(b)), FAISS search restricted to N_q   (Eq. 6)
    refresh = ℓ_θ(b*) under the learner's current weights; if it left [ℓ_low, ℓ_high], the next
              most similar negative (up to ``refresh_candidates``), else the task is skipped
    request = one replay_requests row; a collector fills it with G − 2 fresh rollouts

The selection functions are pure; :class:`ReplayPlanner` wires them to the store, the FAISS index
and a scoring function (the learner's model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from reflexdb import Store, Trajectory
from reflexdb.index import EmbeddingIndex, Neighbor

from . import requests as replay
from .requests import ReplayRequestIn, in_gate

#: ``score(trajectories) -> confidences``: ℓ_θ of each stored trajectory under the current weights.
ScoreFn = Callable[[Sequence[Trajectory]], Sequence[float]]


def replay_quota(groups_per_step: int, ratio: float, n_candidates: int) -> int:
    """Replay groups per batch: ``min(⌊α·B⌋, |E|)`` (NexGRPO.md Sec. 4.3)."""
    return min(int(math.floor(ratio * groups_per_step + 1e-9)), n_candidates)


def difficulty_weight(k: int, n: int, sd: float = 1.0) -> float:
    """Gaussian density ``N(k; n/2, σ)`` of a task with ``k`` of ``n`` rollouts correct (ExGRPO)."""
    return math.exp(-0.5 * ((k - n / 2) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))


def draw_tasks(task_ids: Sequence[int], weights: Sequence[float], m: int, rng: np.random.Generator) -> list[int]:
    """``m`` distinct tasks drawn with probability proportional to ``weights`` (without replacement).

    Tasks with weight 0 come last (uniformly) once the weighted ones are used up.
    """
    ids = np.asarray(task_ids, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    m = min(m, ids.size)
    if m == 0:
        return []
    positive = w > 0
    n_pos = int(positive.sum())
    first = []
    if n_pos:
        take = min(m, n_pos)
        first = rng.choice(ids[positive], size=take, replace=False, p=w[positive] / w[positive].sum()).tolist()
    rest = []
    if m > len(first):
        rest = rng.permutation(ids[~positive])[: m - len(first)].tolist()
    return [int(t) for t in first + rest]


@dataclass
class PlanStats:
    """What one planning round did (logged as ``replay/*`` metrics)."""

    candidates: int = 0  # |E| (before removing tasks already requested)
    wanted: int = 0
    posted: int = 0
    refreshed: int = 0  # candidate negatives whose confidence was recomputed
    discarded: int = 0  # ... and left the gate
    skipped_tasks: int = 0  # tasks given up because no candidate passed the refresh
    cancelled: int = 0  # stale pending requests cancelled
    refreshed_confidences: list[float] = field(default_factory=list)  # of the chosen b*
    cosines: list[float] = field(default_factory=list)  # of the chosen (y+, b*) pairs

    def metrics(self) -> dict[str, float]:
        nan = float("nan")
        return {
            "replay/candidate_tasks": float(self.candidates),
            "replay/requests_posted": float(self.posted),
            "replay/refresh_discard_rate": self.discarded / self.refreshed if self.refreshed else nan,
            "replay/refresh_skipped_tasks": float(self.skipped_tasks),
            "replay/requests_cancelled": float(self.cancelled),
            "replay/negative_confidence_refreshed": (float(np.mean(self.refreshed_confidences))
                                                     if self.refreshed_confidences else nan),
            "replay/planned_pair_cosine": float(np.mean(self.cosines)) if self.cosines else nan,
        }


@dataclass
class _TaskPlan:
    task_id: int
    positive_id: int
    ranked: list[Neighbor]  # most similar negatives first
    pos: int = 0  # next candidate to refresh
    discarded: int = 0


class ReplayPlanner:
    """Chooses replay tasks and posts replay requests (rank 0 of the learner).

    Args:
        store, run_id: where the pools live and requests go.
        index: the run's FAISS index (caught up before each plan).
        conf_low, conf_high: the gate [ℓ_low, ℓ_high].
        refresh: whether to recompute b*'s confidence before choosing it.
        refresh_candidates: most similar negatives tried per task.
        group_size: G of the replay groups.
        rng: the random generator of the task draw and of y+.
    """

    def __init__(self, store: Store, run_id: int, index: EmbeddingIndex, *, conf_low: float, conf_high: float,
                 refresh: bool, refresh_candidates: int, group_size: int, rng: np.random.Generator):
        self.store, self.run_id, self.index = store, run_id, index
        self.conf_low, self.conf_high = conf_low, conf_high
        self.refresh, self.refresh_candidates = refresh, refresh_candidates
        self.group_size = group_size
        self.rng = rng

    def plan(self, quota: Callable[[int], int], score: ScoreFn, *, step: int, version: int,
             min_version: int | None = None) -> PlanStats:
        """Top replay requests in flight up to ``quota(|E|)``; post the new ones.

        Args:
            quota: replay groups wanted in flight given the number of candidate tasks.
            score: ℓ_θ of trajectories under the current weights (used when ``refresh``).
            step, version: the learner's step and policy version (stored with each request).
            min_version: cancel pending requests planned under an older policy first.
        """
        stats = PlanStats()
        if min_version is not None:
            stats.cancelled = replay.cancel_stale_requests(self.store, self.run_id, min_version)
        cands = replay.candidates(self.store, self.run_id)
        stats.candidates = len(cands)
        busy = replay.outstanding(self.store, self.run_id)
        want = quota(len(cands)) - busy.total
        stats.wanted = max(0, want)
        free = [c for c in cands if c.task_id not in busy.task_ids]
        if want <= 0 or not free:
            return stats
        self.index.catch_up()
        order = iter(draw_tasks([c.task_id for c in free], [c.weight for c in free], len(free), self.rng))
        chosen = self.choose(order, want, score, stats)
        replay.post_requests(self.store, self.run_id, chosen, learner_step=step, learner_version=version)
        stats.posted = len(chosen)
        stats.refreshed_confidences = [r.refreshed_confidence for r in chosen if r.refreshed_confidence is not None]
        stats.cosines = [r.cosine for r in chosen]
        return stats

    def choose(self, order, want: int, score: ScoreFn, stats: PlanStats) -> list[ReplayRequestIn]:
        """Walk tasks in ``order`` until ``want`` have an anchor and a boundary failure that passes
        the refresh. Each round refreshes the next candidate of every open task in one ``score`` call."""
        chosen: list[ReplayRequestIn] = []
        open_: list[_TaskPlan] = []
        exhausted = False
        while len(chosen) < want:
            while not exhausted and len(chosen) + len(open_) < want:
                task_id = next(order, None)
                if task_id is None:
                    exhausted = True
                    break
                plan = self.start(task_id)
                if plan is not None:
                    open_.append(plan)
            if not open_:
                break
            trajs = self.store.read_trajectories([p.ranked[p.pos].trajectory_id for p in open_], turns=False)
            confs = list(score(trajs)) if self.refresh else [None] * len(trajs)
            still = []
            for p, t, c in zip(open_, trajs, confs):
                stats.refreshed += c is not None
                if c is None or in_gate(c, self.conf_low, self.conf_high):
                    n = p.ranked[p.pos]
                    chosen.append(ReplayRequestIn(
                        task_id=p.task_id, positive_id=p.positive_id, negative_id=n.trajectory_id, cosine=n.cosine,
                        negative_confidence=t.confidence, refreshed_confidence=None if c is None else float(c),
                        discarded=p.discarded, group_size=self.group_size))
                    continue
                stats.discarded += 1
                p.discarded += 1
                p.pos += 1
                if p.pos < len(p.ranked):
                    still.append(p)
                else:
                    stats.skipped_tasks += 1
            open_ = still
        return chosen

    def start(self, task_id: int) -> _TaskPlan | None:
        """y+ uniform from the task's positive pool; its negatives ranked by cosine (FAISS)."""
        positives, negatives = replay.pool_ids(self.store, task_id)
        positives = [p for p in positives if p in self.index]
        if not positives or not negatives:
            return None  # the pools changed since the candidates were listed
        y_plus = int(self.rng.choice(positives))
        ranked = boundary_failures(self.index, y_plus, negatives, self.refresh_candidates if self.refresh else 1)
        return _TaskPlan(task_id, y_plus, ranked) if ranked else None


def boundary_failures(index: EmbeddingIndex, anchor_id: int, negative_ids: Sequence[int], k: int) -> list[Neighbor]:
    """The ``k`` negatives most similar to the anchor, best first: ``b* = argmax cos(φ(y+), φ(b))``
    over ``negative_ids`` (NexGRPO.md Eq. 6), by an exact FAISS search restricted to those ids."""
    return index.search_trajectory(anchor_id, k, restrict_to=negative_ids)


__all__ = [
    "PlanStats", "ReplayPlanner", "ScoreFn", "boundary_failures", "difficulty_weight", "draw_tasks",
    "replay_quota",
]
