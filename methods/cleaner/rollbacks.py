"""CLEANER's rollbacks in the store (METHODS.md §5; CLEANER.md Sec. 4; docs/cleaner.md).

Every failed tool call that SAAR tried to roll back is a ``purifications`` row of the purified
trajectory: the turn it replaced, the attempts, whether a correction ran, the similarity and the
replacement (``shallow``/``deep``), the error (text and status), the code before and after.

The collector side is ``collector/workflows/cleaner.py`` (with ``collector/saar.py``); it writes,
in one transaction, the training group (each episode's purified trajectory, or its raw one when
nothing was rolled back) with the attachment :class:`Purifications`, and a group of kind
``retry`` holding the raw twins of the purified rows (never trained; each purified row's parent).
The learner side is ``trainer/method_api/cleaner.py``; the view is ``cleaner_tool_errors``.
"""

from __future__ import annotations

from dataclasses import dataclass

from reflexdb.sqlfile import load_queries
from reflexdb.storable import storable_text

Q = load_queries("cleaner.sql", "reflexdb.methods.cleaner")


@dataclass(frozen=True)
class Rollback:
    """One failed tool call SAAR tried to roll back (``collector/saar.py``).

    Attributes:
        turn: the position of the committed turn among the purified episode's response turns.
        attempts: corrections sampled (1..K).
        recovered: a correction ran; then ``similarity`` and ``replacement`` are set.
        similarity: ``Sim`` of the failed and the corrected code (``saar.similarity``: difflib's ratio;
            over lines past ``SIMILARITY_CHARS``).
        replacement: ``shallow`` or ``deep`` (None when not recovered).
        error_text: ``o_t⁻`` as the model was shown it; ``error_status``: its ToolResult status.
        failed_code: ``c_t``; corrected_code: ``c'_t`` (the last attempt's block when none ran).
    """

    turn: int
    attempts: int
    recovered: bool
    similarity: float | None
    replacement: str | None
    error_text: str
    error_status: str
    failed_code: str
    corrected_code: str | None


@dataclass(frozen=True)
class PurificationIn:
    """A ``purifications`` row to write with its group: ``rollback`` of the purified trajectory at
    position ``index`` of the group, whose replaced turn is ``turn_index`` of its turns (prompt
    turns counted)."""

    index: int
    turn_index: int
    rollback: Rollback


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
        for row in self.rows:
            r = row.rollback
            cur.execute(Q["insert_purification"], {
                "trajectory_id": written.trajectory_ids[row.index], "turn_index": row.turn_index,
                "attempts": r.attempts, "recovered": r.recovered, "similarity": r.similarity,
                "replacement": r.replacement, "error_text": storable_text(r.error_text), "error_status": r.error_status,
                "failed_code": storable_text(r.failed_code), "corrected_code": storable_text(r.corrected_code)})


__all__ = ["PurificationIn", "Purifications", "Rollback"]
