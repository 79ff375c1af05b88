"""What a verification group writes besides its trajectories: one row of ``selfcheck_verifications``
per verification, in the group's transaction (a reflexdb attachment, reflexdb/attachments.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INSERT = """
INSERT INTO selfcheck_verifications (trajectory_id, run_id, answer_trajectory_id, verdict, answer_correct, agrees)
SELECT t.id, t.run_id, t.parent_trajectory_id, %(verdict)s, %(answer_correct)s, %(agrees)s
FROM trajectories t WHERE t.id = %(id)s AND t.run_id = %(run_id)s
"""


@dataclass(frozen=True)
class Verdict:
    """The verdict of the group's trajectory ``index`` on the answer it checked."""

    index: int
    verdict: str | None  # "yes", "no", or None: neither word in the reply
    answer_correct: bool

    @property
    def agrees(self) -> bool:
        return self.verdict == ("yes" if self.answer_correct else "no")


@dataclass(frozen=True)
class Verifications:
    """The verdicts of a verification group (the group's task claim stays its work item)."""

    run_id: int
    rows: tuple[Verdict, ...]
    claim: bool = False

    def before(self, cur: Any) -> None:
        return None

    def after(self, cur: Any, written, collector: str | None) -> None:
        if written is None:
            return
        for r in self.rows:
            cur.execute(INSERT, {"id": written.trajectory_ids[r.index], "run_id": self.run_id, "verdict": r.verdict,
                                 "answer_correct": r.answer_correct, "agrees": r.agrees})
