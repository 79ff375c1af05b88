"""Where a trajectory comes from (``trajectories.origin``), and what that means downstream.

The origins are rows of table ``origins`` (migration 0018), not a list in code: a method adds its
own with a revision that inserts rows, and the store (the allowed values), the collector (what it
counts as its own samples and in its pass@1) and the learner (the ratio denominator π_old, the
batch's pass@1) read the facts of a row's origin, so that none of them decides by an ``if`` on an
origin name. ``Store.origins()`` reads the table (once per store, again when a name is new to it).

``pi_old``, the ratio denominator of a row in a loss that has one (METHODS.md §0):

- ``policy``: the row was sampled by the run's policy for the task's plain prompt: π_old is the
  learner's weights at the step's start (``learner.pi_old: recompute``, the default) or the stored
  behaviour log-probs (``learner.pi_old: behaviour``);
- ``stored``: always the stored behaviour log-probs (the row's tokens were sampled in another
  context or earlier: a replayed copy, a rollout under a hint or a guidance, a stitched or purified
  trajectory whose log-probs were recomputed under its own stored context);
- ``learner``: always the learner's weights at the step's start (no behaviour log-probs: imported).

``pass_at_1``: the row counts in pass@1 (a sample of the current policy on the plain prompt, one
attempt at the task as a user would pose it). ``sampled``: the collector that wrote the row
generated its tokens just now (its tokens/s and sample counts). ``method``: the method that owns
the origin (None: shared by all). ``in_failures`` (0021): its failed rows are listed in view
``failures`` (false for a copy of an attempt or a part of one: ``replayed``, R3L's ``distilled``
and ``reflection``).

Group kinds (``groups.kind``) are rows of table ``group_kinds`` the same way (migration 0020):
:class:`GroupKind`, read by ``Store.group_kinds()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

PiOld = Literal["policy", "stored", "learner"]

#: The query ``Store.origins`` runs.
SELECT = "SELECT name, pi_old, pass_at_1, sampled, method, summary, in_failures FROM origins ORDER BY name"


@dataclass(frozen=True)
class Origin:
    """A row of table ``origins``: where a trajectory may come from, and its facts (``pi_old``,
    ``pass_at_1``, ``sampled``, the owning ``method``, ``in_failures``; ``reflexdb/origins.py`` says
    what each means)."""

    name: str
    pi_old: PiOld
    pass_at_1: bool
    sampled: bool
    method: str | None
    summary: str
    in_failures: bool = True


def matching(table: Mapping[str, Origin], **wanted: object) -> set[str]:
    """Names of the origins of ``table`` whose attributes equal ``wanted`` (e.g. ``pi_old="stored"``)."""
    return {o.name for o in table.values() if all(getattr(o, k) == v for k, v in wanted.items())}


#: The query ``Store.group_kinds`` runs.
KINDS_SELECT = "SELECT name, trained, pass_at_1, method, summary FROM group_kinds ORDER BY name"


@dataclass(frozen=True)
class GroupKind:
    """A row of table ``group_kinds`` (migration 0020): what kind of group a group is.

    ``trained``: the learner may take such a group as a group of its batch (``eval`` and a
    method's auxiliary ``retry`` groups are not; a method's own views may still hand their rows to
    the learner). ``pass_at_1``: its rows may count in pass@1, each by its origin's fact (a retry
    group's rows never do: their episodes are counted through the training group's rows).
    """

    name: str
    trained: bool
    pass_at_1: bool
    method: str | None
    summary: str


__all__ = ["KINDS_SELECT", "SELECT", "GroupKind", "Origin", "PiOld", "matching"]
