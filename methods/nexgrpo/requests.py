"""NexGRPO's replay protocol through the database (METHODS.md §3; docs/nexgrpo.md).

The learner plans replay tasks and posts one **replay request** per task: the task, the positive
anchor y+ and the boundary failure b* (stored trajectory ids), their cosine and b*'s confidences.
Collectors claim requests before fresh tasks (``FOR UPDATE SKIP LOCKED``, with a TTL like task
claims), sample G − 2 fresh rollouts of the task with their current policy and write one group of
kind ``replay``: replayed copies of y+ and b* (origin ``replayed``, lineage to the originals,
their stored behaviour log-probs) followed by the fresh rollouts. The request is completed in the
transaction that writes the group (its attachment :class:`RequestClaim`), so a request is done
exactly when its group exists.

The pools and the candidate tasks are SQL views (``nexgrpo_*``); this module only reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reflexdb.errors import ClaimLost
from reflexdb.sqlfile import load_queries

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported by whoever passes one in
    from reflexdb.store import Store

R = load_queries("replay.sql", "reflexdb.methods.nexgrpo")


@dataclass(frozen=True)
class ReplayRequestIn:
    """A replay task the learner wants filled.

    Args:
        task_id: the replayed task q.
        positive_id: y+, drawn uniformly from the task's positive pool.
        negative_id: b*, the most similar negative that passed the confidence refresh.
        cosine: cos(φ(y+), φ(b*)).
        negative_confidence: b*'s stored (behaviour) confidence.
        refreshed_confidence: b*'s confidence under the learner's weights (None: refresh off).
        discarded: more similar negatives the refresh discarded before b*.
        group_size: G; the group holds y+, b* and G − 2 fresh rollouts.
    """

    task_id: int
    positive_id: int
    negative_id: int
    cosine: float
    negative_confidence: float | None
    refreshed_confidence: float | None
    discarded: int
    group_size: int


@dataclass(frozen=True)
class ReplayRequest:
    """A claimed replay request, with the task's prompt and ground truth."""

    id: int
    run_id: int
    task_id: int
    positive_id: int
    negative_id: int
    cosine: float
    group_size: int
    learner_step: int
    learner_version: int
    prompt: str
    ground_truth: str | None
    task_meta: dict[str, Any]


@dataclass(frozen=True)
class RequestClaim:
    """The replay request a replay group fulfils: its attachment (``reflexdb/attachments.py``),
    marked done in the transaction that writes the group.

    Raises (from ``after``):
        ClaimLost: the request is done, cancelled or claimed by another collector than the writer.
    """

    request_id: int
    claim: bool = True

    def before(self, cur) -> None:
        return None

    def after(self, cur, written, collector: str | None) -> None:
        done = cur.execute(R["complete_request"], {"id": self.request_id, "collector": collector,
                                                   "group_id": written.group_id if written else None}).fetchone()
        if done is None:
            raise ClaimLost(f"replay request {self.request_id} is no longer "
                            f"{'collector ' + repr(collector) if collector else 'open'}'s "
                            "(claim expired and taken by another collector, or cancelled); group not written")


@dataclass(frozen=True)
class Outstanding:
    """Replay work the learner has asked for but not trained on yet."""

    requests: int  # pending or claimed
    ready_groups: int  # replay groups written and still eligible for the learner
    task_ids: frozenset[int]  # tasks with a pending or claimed request

    @property
    def total(self) -> int:
        return self.requests + self.ready_groups


@dataclass(frozen=True)
class Candidate:
    """A row of ``nexgrpo_replay_candidates``: a replayable task, its bucket k-of-n and weight."""

    task_id: int
    k: int
    n: int
    weight: float
    n_positive: int
    n_negative: int


def post_requests(store: Store, run_id: int, requests: Sequence[ReplayRequestIn], *, learner_step: int,
                  learner_version: int) -> list[int]:
    """Post replay requests in one transaction; return their ids."""
    ids = []
    with store.transaction() as conn:
        for r in requests:
            ids.append(conn.execute(R["insert_request"], {
                "run_id": run_id, "task_id": r.task_id, "positive_id": r.positive_id, "negative_id": r.negative_id,
                "cosine": float(r.cosine), "negative_confidence": r.negative_confidence,
                "refreshed_confidence": r.refreshed_confidence, "discarded": int(r.discarded),
                "group_size": int(r.group_size), "learner_step": learner_step, "learner_version": learner_version,
            }).fetchone()[0])
    return ids


def claim_requests(store: Store, run_id: int, collector: str, n: int = 1, *,
                   claim_ttl_s: float = 600.0) -> list[ReplayRequest]:
    """Claim up to ``n`` pending replay requests of a run (oldest first) for ``collector``."""
    with store.transaction() as conn:
        rows = conn.execute(R["claim_requests"], {"run_id": run_id, "collector": collector, "n": n,
                                                  "ttl": claim_ttl_s}).fetchall()
    return sorted((ReplayRequest(*r) for r in rows), key=lambda r: r.id)


def release_requests(store: Store, run_id: int, collector: str) -> None:
    """Give back every request ``collector`` holds (they become pending again)."""
    with store.transaction() as conn:
        conn.execute(R["release_requests"], {"run_id": run_id, "collector": collector})


def claimed_by_others(store: Store, run_id: int, collector: str, *, claim_ttl_s: float = 600.0) -> int:
    """Requests other collectors hold live claims on (each becomes a replay group): admission's in-flight count."""
    with store.transaction() as conn:
        return int(conn.execute(R["claimed_by_others"], {"run_id": run_id, "collector": collector,
                                                         "ttl": claim_ttl_s}).fetchone()[0])


def cancel_request(store: Store, request_id: int) -> None:
    with store.transaction() as conn:
        conn.execute(R["cancel_request"], {"id": request_id})


def cancel_stale_requests(store: Store, run_id: int, min_version: int) -> int:
    """Cancel pending requests planned under a policy older than ``min_version``; return how many."""
    with store.transaction() as conn:
        return conn.execute(R["cancel_stale_requests"], {"run_id": run_id, "min_version": min_version}).rowcount


def outstanding(store: Store, run_id: int) -> Outstanding:
    with store.transaction() as conn:
        n_req, n_ready, tasks = conn.execute(R["outstanding"], {"run_id": run_id}).fetchone()
    return Outstanding(int(n_req), int(n_ready), frozenset(int(t) for t in tasks))


def candidates(store: Store, run_id: int, split: str = "train") -> list[Candidate]:
    """The run's replayable tasks (view ``nexgrpo_replay_candidates``), by task id."""
    with store.transaction() as conn:
        rows = conn.execute(R["candidates"], {"run_id": run_id, "split": split}).fetchall()
    return [Candidate(int(t), int(k), int(n), float(w), int(p), int(q)) for t, k, n, w, p, q in rows]


def pool_ids(store: Store, task_id: int) -> tuple[list[int], list[int]]:
    """A task's positive and negative pool members that have an embedding, by id."""
    with store.transaction() as conn:
        pos = [r[0] for r in conn.execute(R["positive_ids"], {"task_id": task_id}).fetchall()]
        neg = [r[0] for r in conn.execute(R["negative_ids"], {"task_id": task_id}).fetchall()]
    return pos, neg


def retired_count(store: Store, run_id: int, split: str = "train") -> int:
    with store.transaction() as conn:
        return int(conn.execute(R["retired_count"], {"run_id": run_id, "split": split}).fetchone()[0])


def in_gate(conf: float, low: float, high: float) -> bool:
    """Whether a confidence lies in the gate ``[low, high]`` (both ends included, as in the view)."""
    return low <= conf <= high


__all__ = [
    "Candidate", "Outstanding", "ReplayRequest", "ReplayRequestIn", "RequestClaim", "cancel_request", "cancel_stale_requests",
    "candidates", "claim_requests", "in_gate", "outstanding", "pool_ids", "post_requests",
    "release_requests", "retired_count",
]
