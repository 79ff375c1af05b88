"""Where a trajectory comes from (``trajectories.origin``), and what that means downstream.

One table, read by the store (the allowed values), the collector (what it counts as its own
samples and in its pass@1) and the learner (the ratio denominator π_old, the batch's pass@1), so
that none of them decides by an ``if`` on an origin name.

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
generated its tokens just now (its tokens/s and sample counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PiOld = Literal["policy", "stored", "learner"]


@dataclass(frozen=True)
class Origin:
    name: str
    pi_old: PiOld
    pass_at_1: bool
    sampled: bool
    summary: str


_TABLE = (
    Origin("base", "policy", True, True, "sampled by the policy for the task's plain prompt"),
    Origin("distilled", "stored", False, False,
           "R3L: a base episode's turns before the pivot, then a guided retry's turns, guidance removed; "
           "log-probs recomputed under this plain context"),
    Origin("guided_retry", "stored", False, True, "R3L: a retry from the pivot with the reflection's guidance in context"),
    Origin("hinted", "stored", False, True, "LTE: sampled under a hint; stored with the plain prompt's ids"),
    Origin("imported", "learner", False, False, "another framework's rollout (reflexdb import): no behaviour log-probs"),
    Origin("purified", "stored", True, False,
           "CLEANER: an episode with its failed tool calls rolled back (corrections in their place); log-probs "
           "recomputed under this context. It is the episode's pass@1 sample; its raw twin, in a group of kind "
           "'retry', is not"),
    Origin("raw", "policy", True, True, "CLEANER: a tool-use episode as sampled (failed calls and their errors kept)"),
    Origin("reflection", "stored", False, True,
           "R3L: the policy's reflection on a base episode (prompt: the episode and its feedback)"),
    Origin("replayed", "stored", False, False, "a stored trajectory replayed in a later group (NexGRPO, LTE)"),
)

#: name -> :class:`Origin`, in the order of the schema's check constraint.
ORIGINS: dict[str, Origin] = {o.name: o for o in _TABLE}
#: The names, in order (``trajectories.origin``'s allowed values; a row's code in a learner batch).
NAMES: tuple[str, ...] = tuple(ORIGINS)
CODE: dict[str, int] = {name: i for i, name in enumerate(NAMES)}


def codes_where(**wanted: object) -> list[int]:
    """Codes of the origins whose attributes equal ``wanted`` (e.g. ``pi_old="stored"``)."""
    return [CODE[o.name] for o in _TABLE if all(getattr(o, k) == v for k, v in wanted.items())]


__all__ = ["CODE", "NAMES", "ORIGINS", "Origin", "codes_where"]
