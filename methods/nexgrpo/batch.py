"""NexGRPO's batch rule (METHODS.md §3; docs/nexgrpo.md): the oldest eligible groups, at most
``max_replay`` of them replay groups. Its hook ``select`` (methods/nexgrpo/__init__.py) uses it in
place of the learner's plain oldest-first choice (``reflexdb.trainer.batch.eligible_group_ids``)."""

from __future__ import annotations

from reflexdb import Store
from reflexdb.sqlfile import load_queries
from reflexdb.trainer.batch import Selection

R = load_queries("replay.sql", "reflexdb.methods.nexgrpo")


def replay_selection(store: Store, run_id: int, n: int, *, min_version: int | None = None,
                     max_replay: int) -> Selection:
    """The batch: at most ``max_replay`` replay groups, oldest first, and the oldest fresh groups
    for the rest; fewer than ``n`` ids come back while fresh groups are short (the learner waits
    for more). The two kinds are ranked separately, so a replay group is found however many fresh
    groups collectors have written ahead of it; ``min_version`` as in ``eligible_group_ids``.

    Returns:
        The ids in increasing order, and the query's snapshot.
    """
    params = {"run_id": run_id, "n": n, "max_replay": max_replay,
              "min_version": min_version if min_version is not None else -2**31}
    with store.transaction() as conn:
        ids, kinds, snapshot = conn.execute(R["eligible_groups_with_replay"], params).fetchone()
    rows = [(int(g), k) for g, k in zip(ids or (), kinds or ())]
    return Selection(compose_batch(rows, n, max_replay), snapshot)


def compose_batch(rows: list[tuple[int, str]], n: int, max_replay: int) -> list[int]:
    """Up to ``n`` group ids from ``(group_id, kind)`` rows in FIFO order: at most ``max_replay``
    replay groups, fresh groups for the rest (fewer than ``n`` when fresh ones are short).

    Replay groups never fill in for missing fresh ones: collectors fill replay requests first, so
    at times only replay groups are ready, and taking them all would make one batch all replay and
    the next ones none (measured: docs/experiments.md).
    """
    replay = [g for g, k in rows if k == "replay"][:max_replay]
    fresh = [g for g, k in rows if k != "replay"][: n - len(replay)]
    return sorted(replay + fresh)
