"""LTE's hint stages through the database (METHODS.md §2; docs/lte.md).

A none-pass fresh group (view ``lte_hint_pool``) gets one **hint stage** (table ``lte_stages``):

    pending   opened from the pool by a collector looking for work (:func:`claim_stages`)
    claimed   a collector holds it (``FOR UPDATE SKIP LOCKED``; after ``claim_ttl_s`` another may take it)
    done      the collector wrote, in one transaction, the ``hints`` row and — if any extra rollout
              was correct — the LTE group that trains instead of the original (:class:`LteStageIn`,
              the group's attachment, or :func:`finish_unsolved` when none was)
    released  the stage timed out and the learner took the original group as it is

Completing a stage (``LteStageIn.after``) only succeeds on a stage the writer still holds, and the learner's release
only on one not done: whichever commits first wins, so a group and its LTE group are never both
trained. The collector side is ``workflow.py``, the learner side the method (``__init__.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reflexdb.errors import ClaimLost
from reflexdb.sqlfile import load_queries

if TYPE_CHECKING:
    from reflexdb.store import Store

Q = load_queries("lte.sql", "reflexdb.methods.lte")


@dataclass(frozen=True)
class HintIn:
    """A hints row to write with its stage (its id reserved first: :func:`reserve_hint_id`)."""

    id: int
    kind: str
    wrong_answers: list[str]
    hinted_prompt: str


@dataclass(frozen=True)
class LteStageIn:
    """The stage an LTE group finishes: the group's attachment (``reflexdb/attachments.py``), so the
    hints row comes before the group, and the stage is completed and each hinted row linked to the
    hint (table ``trajectory_hints``) in the group's transaction.

    Attributes:
        group_id: the original none-pass group.
        task_id: its task.
        mode: ``hint`` (LTE) or ``extra`` (GRPO_Extra: plain prompt, no hints row).
        hint: the hints row (hint mode), else ``None``.
        n_sampled: G, the extra rollouts sampled.
        n_correct: G', the correct ones (each replaced a failed original).
    """

    group_id: int
    task_id: int
    mode: str
    hint: HintIn | None
    n_sampled: int
    n_correct: int
    claim: bool = True  # the LTE group completes this stage, not a task claim

    def before(self, cur) -> None:
        """The stage's hints row (hint mode; nothing otherwise): the hinted trajectories refer to it."""
        if self.hint is not None:
            h = self.hint
            cur.execute(Q["insert_hint"], {"id": h.id, "group_id": self.group_id, "task_id": self.task_id,
                                           "kind": h.kind, "wrong_answers": list(h.wrong_answers),
                                           "hinted_prompt": h.hinted_prompt})

    def after(self, cur, written, collector: str | None) -> None:
        """Mark the stage done (``written``: the LTE group, or None when no extra rollout was correct).

        Raises:
            ClaimLost: ``collector`` no longer holds the stage; the transaction rolls back.
        """
        done = cur.execute(Q["complete_stage"], {
            "group_id": self.group_id, "collector": collector, "mode": self.mode,
            "hint_id": self.hint.id if self.hint else None, "lte_group_id": written.group_id if written else None,
            "n_sampled": self.n_sampled, "n_correct": self.n_correct}).fetchone()
        if done is None:
            raise ClaimLost(f"the hint stage of group {self.group_id} is no longer collector {collector!r}'s "
                            "(claim expired and taken by another collector, or released to the learner after "
                            "its timeout); nothing of it was written")
        if written is not None and self.hint is not None:  # each hinted row's hint: LTE's table trajectory_hints
            cur.execute(Q["link_hinted_rows"], {"hint_id": self.hint.id, "lte_group_id": written.group_id})


@dataclass(frozen=True)
class ClaimedStage:
    """A claimed stage with what the collector needs: the pool row of its group."""

    group_id: int
    run_id: int
    task_id: int
    prompt: str
    ground_truth: str | None
    policy_version: int
    size: int
    hint_kind: str
    wrong_answers: list[str]


def claim_stages(store: Store, run_id: int, collector: str, n: int, *, min_version: int, timeout_s: float,
                 claim_ttl_s: float = 600.0) -> list[ClaimedStage]:
    """Open stages for new pool entries, then claim up to ``n`` of them for ``collector``.

    Args:
        min_version: the oldest policy version a group may have and still be trained (the newest
            version minus ``max_staleness``): older groups are not worth hinting.
        timeout_s: a group older than this is left to the learner (``lte.hint_timeout_s``).
    """
    with store.transaction() as conn:
        conn.execute(Q["open_stages"], {"run_id": run_id, "min_version": min_version, "timeout": timeout_s})
    with store.transaction() as conn:
        ids = [r[0] for r in conn.execute(Q["claim_stages"], {
            "run_id": run_id, "collector": collector, "n": n, "ttl": claim_ttl_s, "timeout": timeout_s}).fetchall()]
        if not ids:
            return []
        rows = conn.execute(Q["claimed_pool"], {"ids": ids}).fetchall()
    found = [ClaimedStage(int(g), int(r), int(t), p, gt, int(v), int(s), k, list(w)) for g, r, t, p, gt, v, s, k, w in rows]
    gone = set(ids) - {s.group_id for s in found}
    if gone:  # a hints row appeared or a row changed since: not in the pool any more
        release_groups(store, run_id, collector, sorted(gone))
    return found


def release_stages(store: Store, run_id: int, collector: str) -> None:
    """Give back every stage ``collector`` holds (they become pending again)."""
    with store.transaction() as conn:
        conn.execute(Q["release_stages"], {"run_id": run_id, "collector": collector})


def release_groups(store: Store, run_id: int, collector: str, group_ids: Sequence[int]) -> None:
    """Give back some of ``collector``'s stages."""
    with store.transaction() as conn:
        conn.execute(Q["release_some_stages"], {"run_id": run_id, "collector": collector, "ids": list(group_ids)})


def reserve_hint_id(store: Store) -> int:
    with store.transaction() as conn:
        return int(conn.execute(Q["reserve_hint_id"]).fetchone()[0])


def finish_unsolved(store: Store, stage: LteStageIn, collector: str) -> None:
    """A stage none of whose extra rollouts was correct: the hints row and 'done', no group.

    Raises:
        ClaimLost: ``collector`` no longer holds the stage; nothing is written.
    """
    store.complete([stage], collector=collector)


@dataclass(frozen=True)
class StageInfo:
    """A stage as the learner's metrics see it (query ``stages_of_groups``)."""

    group_id: int
    lte_group_id: int | None
    status: str
    mode: str | None
    n_sampled: int | None
    n_correct: int | None
    hint_kind: str | None
    latency_s: float


def stages_of(store: Store, group_ids: Sequence[int]) -> list[StageInfo]:
    """The stages of these groups, as originals or as LTE groups."""
    with store.transaction() as conn:
        rows = conn.execute(Q["stages_of_groups"], {"ids": list(group_ids)}).fetchall()
    return [StageInfo(int(g), None if lg is None else int(lg), st, m, ns, nc, k, float(lat))
            for g, lg, st, m, ns, nc, k, lat in rows]


def eligible_group_ids(store: Store, run_id: int, n: int, *, min_version: int, timeout_s: float,
                       train_unsolved: bool = True) -> tuple[list[int], str | None, int]:
    """LTE's batch rule: the ``n`` oldest groups that may train now (query ``eligible_groups``).

    A none-pass group waits for its stage while younger than ``timeout_s``; one that timed out
    is released to the learner first (a stage that finished meanwhile wins, and the group is
    dropped from this choice). Returns ``(ids, snapshot, released)``.
    """
    with store.transaction() as conn:
        ids, stages, snapshot = conn.execute(Q["eligible_groups"], {
            "run_id": run_id, "n": n, "min_version": min_version, "timeout": timeout_s,
            "train_unsolved": train_unsolved}).fetchone()
    rows = list(zip(ids or (), stages or ()))
    timed_out = [int(g) for g, s in rows if s == "timed_out"]
    released: set[int] = set()
    if timed_out:
        with store.transaction() as conn:
            released = {int(r[0]) for r in conn.execute(Q["release_to_learner"],
                                                         {"ids": timed_out, "run_id": run_id}).fetchall()}
    keep = [int(g) for g, s in rows if s != "timed_out" or int(g) in released]
    return keep, snapshot, len(released)


__all__ = ["ClaimedStage", "HintIn", "LteStageIn", "StageInfo", "claim_stages", "eligible_group_ids",
           "finish_unsolved", "release_groups", "release_stages", "reserve_hint_id", "stages_of"]
