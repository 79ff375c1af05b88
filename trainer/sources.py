"""Where a learner step's groups come from: batch sources.

A step takes ``learner.groups_per_step`` groups from its sources (:func:`choose`): each source
with a quota first (at most that many), then the one without a quota fills the rest. A source is
any object with::

    quota                           most groups per step, or None: the rest
    take(n, min_version)            a Selection of at most n eligible groups (reflexdb.trainer.batch)
    metrics(batch)                  the step's metrics about this source's rows

Built in: :class:`MethodGroups` (the method's batch rule, or the oldest eligible groups of the
view ``learner_eligible`` under the staleness rule) and :class:`ImportedGroups` (the oldest
eligible imported groups, ``learner.imported_per_step``; no staleness rule, no behaviour
log-probs: their π_old is the learner's, the table of origins says so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from reflexdb import Store

from .batch import Batch, Selection, eligible_group_ids, eligible_imported_ids


class BatchSource(Protocol):
    quota: int | None

    def take(self, n: int, min_version: int) -> Selection: ...

    def metrics(self, batch: Batch) -> dict[str, float]: ...


class MethodGroups:
    """The groups the method's rule chooses (its hooks' ``select``), by default the oldest eligible
    ones that the view ``drops`` (``Method.drops``) does not list."""

    quota = None

    def __init__(self, store: Store, run_id: int, select: Callable[[int, int], Selection] | None = None,
                 drops: str | None = None):
        self.select = select or (lambda n, min_version: eligible_group_ids(store, run_id, n, min_version=min_version,
                                                                           drops=drops))

    def take(self, n: int, min_version: int) -> Selection:
        return self.select(n, min_version)

    def metrics(self, batch: Batch) -> dict[str, float]:
        return {}


class ImportedGroups:
    """Up to ``quota`` of the oldest eligible imported groups per step."""

    def __init__(self, store: Store, run_id: int, quota: int):
        self.store, self.run_id, self.quota = store, run_id, quota

    def take(self, n: int, min_version: int) -> Selection:
        return Selection(eligible_imported_ids(self.store, self.run_id, n))

    def metrics(self, batch: Batch) -> dict[str, float]:
        imported = batch.imported & batch.valid
        return {"imported/groups": float(sum(k == "imported" for k in batch.group_kinds)),
                "imported/reward_mean": float(batch.rewards[imported].mean()) if imported.any() else float("nan")}


def choose(sources: Sequence[BatchSource], n: int, min_version: int,
           db: Callable[[Callable[[], Any]], Any] = lambda fn: fn()) -> Selection:
    """At most ``n`` groups from the sources (module docstring): ids in increasing order, the
    snapshot of the first source whose query has one, every source's auxiliary rows."""
    ids: list[int] = []
    extra: list[int] = []
    snapshot = None
    for src in sorted(sources, key=lambda s: s.quota is None):  # quotas first, the rest last
        want = n - len(ids) if src.quota is None else min(src.quota, n - len(ids))
        if want <= 0 and src.quota is not None:
            continue
        sel = db(lambda: src.take(want, min_version))  # noqa: B023 - called at once
        ids += sel.group_ids
        extra += sel.extra
        snapshot = snapshot or sel.snapshot
    return Selection(sorted(ids), snapshot, extra)
