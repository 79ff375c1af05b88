"""CLEANER's rollbacks in the store (METHODS.md §5; CLEANER.md Sec. 4; docs/cleaner.md).

Every failed tool call that SAAR tried to roll back is a ``purifications`` row of the purified
trajectory: the turn it replaced, the attempts, whether a correction ran, the similarity and the
replacement (``shallow``/``deep``), the error (text and status), the code before and after.

The collector side is ``collector/workflows/cleaner.py`` (with ``collector/saar.py``); it writes,
in one transaction, the training group (each episode's purified trajectory, or its raw one when
nothing was rolled back) with the attachment :class:`Purifications`, and a group of kind
``retry`` holding the raw twins of the purified rows (never trained; each purified row's parent).
The learner side is ``trainer/methods/cleaner.py``; the view is ``cleaner_tool_errors``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sqlfile import load_queries

Q = load_queries("cleaner.sql")


@dataclass(frozen=True)
class PurificationIn:
    """A ``purifications`` row to write with its group.

    Attributes:
        index: the purified trajectory's position in the group.
        turn_index: the replaced turn's index in that trajectory's turns (prompt turns counted).
        attempts, recovered, similarity, replacement, error_text, error_status, failed_code,
        corrected_code: as :class:`collector.saar.Rollback` (``replacement`` None when not recovered).
    """

    index: int
    turn_index: int
    attempts: int
    recovered: bool
    similarity: float | None
    replacement: str | None
    error_text: str
    error_status: str
    failed_code: str
    corrected_code: str | None


def _text(value: str | None) -> str | None:
    return None if value is None else value.replace("\x00", "\ufffd")  # PostgreSQL text holds no NUL


@dataclass(frozen=True)
class Purifications:
    """The training group's attachment (``reflexdb/attachments.py``): its rollbacks, inserted
    after the group (each refers to a purified trajectory). Not a claim: the group completes its
    task's claim."""

    rows: tuple[PurificationIn, ...]
    claim: bool = False

    def before(self, cur) -> None:
        return None

    def after(self, cur, written, collector: str | None) -> None:
        for r in self.rows:
            cur.execute(Q["insert_purification"], {
                "trajectory_id": written.trajectory_ids[r.index], "turn_index": r.turn_index, "attempts": r.attempts,
                "recovered": r.recovered, "similarity": r.similarity, "replacement": r.replacement,
                "error_text": _text(r.error_text), "error_status": r.error_status,
                "failed_code": _text(r.failed_code), "corrected_code": _text(r.corrected_code)})


__all__ = ["PurificationIn", "Purifications"]
