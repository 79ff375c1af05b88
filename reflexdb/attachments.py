"""What a group writes besides its trajectories, in the same transaction.

A group (:class:`~reflexdb.records.GroupIn`) carries ``attachments``. Each is an object that the
store calls twice inside the transaction that writes the group::

    before(cur)                        rows the group's trajectories refer to (a hint)
    after(cur, written, collector)     complete the claimed work item the group finishes (a task
                                       claim, a replay request, a hint stage, ...) and write rows
                                       that refer to the trajectories (reflections, rollbacks)

``cur`` is a psycopg cursor inside the transaction; ``written`` is the group's
:class:`~reflexdb.records.WrittenGroup` (its ids), or ``None`` when a work item ends without a
group (:meth:`Store.complete`); ``collector`` is the writer's name (``None``: no claim is held).

An attachment whose work item is no longer the writer's (its claim expired and another collector
took it, it was cancelled or released) raises :class:`~reflexdb.errors.ClaimLost` from ``after``:
the transaction rolls back and nothing of the group is written. An attachment with ``claim =
True`` is the group's work item; a group with none completes its task's claim
(:class:`TaskClaim`): a plain group of a claimed task.

Each method implements its own attachments in its own module (``methods/nexgrpo/requests.py``,
``methods/lte/stages.py``, ``methods/r3l/reflections.py``); the store only calls the two steps, in order: every
group's ``before``, the groups and their trajectories, every group's ``after``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .sqlfile import load_queries

if TYPE_CHECKING:
    from .records import GroupIn, WrittenGroup

W = load_queries("work.sql")


@runtime_checkable
class Attachment(Protocol):
    """Rows and a work item written with a group, in its transaction (module docstring)."""

    #: Whether this attachment is the work item the group completes (else the task claim is).
    claim: bool

    def before(self, cur: Any) -> None:
        """Write the rows the group's trajectories refer to (``cur``: a psycopg cursor, ``%(name)s``
        parameters), before the group."""

    def after(self, cur: Any, written: WrittenGroup | None, collector: str | None) -> None:
        """Write the rows that refer to the group's trajectories (``written.trajectory_ids``, in the
        group's order) and complete the work item; raise ``ClaimLost`` when it is no longer the
        writer's. ``written`` is ``None`` when the item ends without a group."""


@dataclass(frozen=True)
class TaskClaim:
    """The claim a collector holds on a task (``reflexdb.work.claim_tasks``): writing the task's
    group releases it and counts the collection (``tasks.times_collected``), so a task is counted
    exactly when its group exists. Another collector's claim (or none) is left alone and not
    counted; the group is written all the same (a claim only keeps collectors off the same task)."""

    task_id: int
    claim: bool = True

    def before(self, cur: Any) -> None:
        return None

    def after(self, cur: Any, written: WrittenGroup | None, collector: str | None) -> None:
        if collector is not None:
            cur.execute(W["complete_claims"], {"ids": [self.task_id], "collector": collector})


def work_items(groups: Sequence[GroupIn]) -> list[tuple[int, Attachment]]:
    """``(group position, attachment)`` of every attachment of a write, in group order, each group's
    task claim first when none of its attachments is its work item. A task's claim appears once per
    write, however many of its groups the write holds (a method's groups written together)."""
    items: list[tuple[int, Attachment]] = []
    claimed: set[int] = set()
    for k, g in enumerate(groups):
        if not any(getattr(a, "claim", False) for a in g.attachments) and g.task_id not in claimed:
            claimed.add(g.task_id)
            items.append((k, TaskClaim(g.task_id)))
        items += [(k, a) for a in g.attachments]
    return items


__all__ = ["Attachment", "TaskClaim", "work_items"]
