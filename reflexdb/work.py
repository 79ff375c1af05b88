"""The collector's side of the work protocol: claims, admission control, liveness.

- **Claims**: a collector claims a task (``FOR UPDATE SKIP LOCKED``) before sampling its group,
  so several collectors never work on the same task at once; writing the group releases the
  claim and counts the collection in the same transaction (``Store.write_group(...,
  complete_claim=name)``). A claim older than ``claim_ttl_s`` is considered abandoned (a collector
  died) and can be taken by another.
- **Soft retirement** (NexGRPO, METHODS.md §3): with ``retire_prob`` set, a claimed task that is
  retired (listed by the view ``retired`` names, the method's: NexGRPO's ``nexgrpo_retired_tasks``
  lists tasks whose latest group was all correct) is kept with
  probability ε and otherwise passed over: released, with its turn counted (``times_passed``), so
  it waits for the next epoch. Each time a retired task's turn comes it is drawn with probability ε.
- **Admission control** (AReaL's ``max_head_offpolicyness``): the n-th on-policy group of a run
  is consumed by learner step ``n // groups_per_step``, which trains policy version
  ``(n // groups_per_step) // publish_every`` (one version every ``publish_every`` steps). A
  collector holding version ``v`` starts group ``n`` only if that consumption version minus ``v``
  is at most ``eta``; otherwise it waits for a newer policy. Staleness is bounded by construction
  instead of by dropping data afterwards. With ``learner.imported_per_step`` k > 0, steps take
  only G − k fresh groups while imported ones last, and the count goes from the learner's
  position instead: group ``n`` waits behind the ``n − c`` fresh groups not yet consumed (``c``
  consumed by the ``S`` steps so far), at G − k a step for as long as the eligible imported
  groups fill k a step, then at G; it is consumed by step ``S + m`` of that count. A group the
  run's method never trains (listed by the view its ``Method.drops`` names: a batch rule that
  drops zero-variance groups, say) is not counted: no step takes it, so it moves no group to a
  later step. Groups still to be written are counted as trained (the safe side: a collector may
  wait a little longer than it must, never start a group that would be too stale).
"""

from __future__ import annotations

import json

import os
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ReflexdbError
from .sqlfile import load_queries, relation
from .storable import storable_text
from .store import Store

W = load_queries("work.sql")


@dataclass(frozen=True)
class ClaimedTask:
    id: int
    dataset: str
    split: str
    task_key: str
    prompt: str
    ground_truth: str | None
    meta: dict[str, Any]
    times_collected: int
    retired: bool = False  # only looked up under soft retirement


@dataclass
class RetirementDraws:
    """What soft retirement decided in a claim: retired tasks kept (drawn) and passed over."""

    drawn: int = 0
    passed: int = 0


#: Claim rounds per call under soft retirement (each round passes some retired tasks over).
MAX_CLAIM_ROUNDS = 64


def claim_tasks(
    store: Store, run_id: int, collector: str, n: int = 1, *, split: str = "train",
    max_collections: int = 2**31 - 1, claim_ttl_s: float = 600.0, retire_prob: float | None = None,
    retired: str | None = None, rng: np.random.Generator | None = None, draws: RetirementDraws | None = None,
) -> list[ClaimedTask]:
    """Claim up to ``n`` tasks for ``collector`` (possibly none, if all are taken or done).

    Args:
        retire_prob: NexGRPO's ε. ``None`` (default): retirement is ignored, every task is drawn
            in turn. Otherwise each claimed retired task is kept with probability ``retire_prob``
            and passed over otherwise (its turn counted); the claim continues until ``n`` tasks are
            kept, no task is left to claim, or :data:`MAX_CLAIM_ROUNDS` rounds were drawn.
        retired: with ``retire_prob``, the view (or table) whose ``task_id`` column lists the retired
            tasks: the method's, named in its workflow options.
        rng: the random generator of the draws (default: a fresh one).
        draws: if given, counts the retired tasks drawn and passed over.
    """
    soft = retire_prob is not None
    if soft and not retired:
        raise ValueError("soft retirement (retire_prob) needs the view that lists the retired tasks (retired)")
    claim = claim_sql(retired)
    rng = rng if rng is not None else np.random.default_rng()
    kept: list[ClaimedTask] = []
    with store.transaction() as conn:  # one transaction: passed-over tasks are released with the claim
        for _ in range(MAX_CLAIM_ROUNDS if soft else 1):
            rows = conn.execute(
                claim,
                {"run_id": run_id, "split": split, "max_collections": max_collections, "ttl": claim_ttl_s,
                 "n": n - len(kept), "collector": collector, "soft_retirement": soft},
            ).fetchall()
            passed = []
            for task in sorted((ClaimedTask(*r) for r in rows), key=lambda t: t.id):
                if task.retired and rng.random() >= retire_prob:
                    passed.append(task.id)
                else:
                    kept.append(task)
                    if draws is not None and task.retired:
                        draws.drawn += 1
            if passed:
                conn.execute(W["pass_tasks"], {"ids": passed, "collector": collector})
                if draws is not None:
                    draws.passed += len(passed)
            if not rows or len(kept) >= n:
                break
    return kept


def claim_sql(retired: str | None = None):
    """The claim query (``work.sql`` ``claim_tasks``), reading the retired tasks from ``retired`` (a
    quoted identifier, ``schema.view`` allowed), or from nothing: the lookup is skipped then. The
    failure drill's probe claims with it too."""
    from psycopg import sql

    view = sql.Identifier(*retired.split(".")) if retired else sql.SQL("(SELECT NULL::bigint AS task_id)")
    return sql.SQL(W["claim_tasks"]).format(retired=view)


def split_tasks(store: Store, run_id: int, split: str, n: int | None = None) -> list[tuple]:
    """Up to ``n`` tasks of a split of the run (``split_tasks``: what ``reflexdb eval`` samples)."""
    with store.transaction() as conn:
        return conn.execute(W["split_tasks"], {"run_id": run_id, "split": split, "n": n or 2**31 - 1}).fetchall()


def tasks_left(store: Store, run_id: int, max_collections: int) -> int:
    """Train tasks collected fewer than ``max_collections`` times."""
    with store.transaction() as conn:
        return int(conn.execute(W["tasks_left"], {"run_id": run_id, "max_collections": max_collections}).fetchone()[0])


def release_claims(store: Store, run_id: int, collector: str) -> None:
    """Release every claim ``collector`` holds, without counting a collection."""
    with store.transaction() as conn:
        conn.execute(W["release_claims"], {"run_id": run_id, "collector": collector})


def register_collector(store: Store, run_id: int, name: str, *, engine: str, model: str,
                       policy_version: int | None) -> int:
    with store.transaction() as conn:
        return conn.execute(
            W["register_collector"],
            {"run_id": run_id, "name": name, "host": socket.gethostname(), "pid": os.getpid(), "engine": engine,
             "model": model, "policy_version": policy_version},
        ).fetchone()[0]


def report_progress(store: Store, collector_id: int, *, policy_version: int | None, groups: int = 0,
                    trajectories: int = 0, tokens: int = 0, reward_errors: int = 0, skipped_rows: int = 0,
                    unverified_rewards: int = 0, phase_seconds: dict[str, float] | None = None) -> None:
    """Add this interval's counts to the collector's row; ``phase_seconds`` (cumulative seconds per
    phase and ``wall``) replaces the stored totals when given."""
    with store.transaction() as conn:
        conn.execute(
            W["collector_progress"],
            {"id": collector_id, "policy_version": policy_version, "groups": groups, "trajectories": trajectories,
             "tokens": tokens, "reward_errors": reward_errors, "skipped_rows": skipped_rows,
             "unverified_rewards": unverified_rewards,
             "phase_seconds": json.dumps(phase_seconds) if phase_seconds is not None else None},
        )


def collector_phases(store: Store, run_id: int) -> dict[str, float]:
    """The run's collectors' ``phase_seconds`` summed key by key (seconds per phase, ``wall``,
    ``tokens``); ``{}`` before any heartbeat."""
    with store.transaction() as conn:
        return {k: float(v) for k, v in conn.execute(W["collector_phases"], {"run_id": run_id}).fetchall()}


def record_rejection(store: Store, collector_id: int, reason: str) -> None:
    """Count a group the store refused for its content (``collectors.rejected_groups``) and keep
    the reason (``collectors.last_rejection``)."""
    with store.transaction() as conn:
        conn.execute(W["collector_rejected"], {"id": collector_id, "reason": storable_text(reason)[:2000]})


def mark_stopped(store: Store, collector_id: int, status: str = "stopped") -> None:
    with store.transaction() as conn:
        conn.execute(W["collector_stopped"], {"id": collector_id, "status": status})


@dataclass(frozen=True)
class Admission:
    allowed: bool
    next_group: int  # run-wide index of the group about to start
    consume_version: int  # the learner version expected to consume it
    staleness: int  # consume_version - the collector's version
    room: int = 0  # groups that may start now, this one first (0: none): a batch claims at most these


def admission(
    store: Store, run_id: int, collector: str, *, policy_version: int, eta: int, groups_per_step: int,
    publish_every: int, claim_ttl_s: float = 600.0, imported_per_step: int = 0, in_flight: int = 0,
    drops: str | None = None,
) -> Admission:
    """May ``collector`` (holding ``policy_version``) start another on-policy group now?

    ``in_flight``: groups other collectors are making from claims other than tasks' (a method's
    work, counted by its workflow's ``in_flight``: NexGRPO's claimed replay requests).
    ``drops``: the view of the groups the run's method never trains (``Method.drops``): they are
    not counted.
    """
    from psycopg import sql

    produced = sql.SQL(W["produced_groups"]).format(drops=relation(drops, "group_id"))
    with store.transaction() as conn:
        written, claimed = conn.execute(
            produced, {"run_id": run_id, "collector": collector, "ttl": claim_ttl_s}
        ).fetchone()
        n = written + claimed + in_flight
        G, P = max(1, groups_per_step), max(1, publish_every)
        if imported_per_step > 0:
            steps, consumed, imported_left = conn.execute(W["imported_share"], {"run_id": run_id}).fetchone()

            def step_of(j: int) -> int:  # the step that consumes the group j places after group n
                return steps + steps_until_consumed(n + j - consumed, G, min(imported_per_step, G), int(imported_left))
        else:
            def step_of(j: int) -> int:
                return (n + j) // G
    stale = step_of(0) // P - policy_version
    room = 0
    if stale <= eta:  # the last place whose group is consumed within the bound (step_of never decreases)
        room, hi = 1, 2
        while step_of(hi - 1) // P - policy_version <= eta:
            room, hi = hi, hi * 2
        while hi - room > 1:
            mid = (room + hi) // 2
            room, hi = (mid, hi) if step_of(mid - 1) // P - policy_version <= eta else (room, mid)
    return Admission(stale <= eta, n, step_of(0) // P, stale, room)


def check_drops(store: Store, method: str, drops: str | None) -> None:
    """Refuse to start when the view ``drops`` that method ``method`` declares (``Method.drops``)
    cannot be read here: missing (its migration branch not applied), without a ``group_id``
    column, or not readable by this login.

    Raises:
        ReflexdbError: naming the method, the view and the way out.
    """
    import psycopg
    from psycopg import sql

    if drops is None:
        return
    probe = sql.SQL("SELECT group_id FROM {} LIMIT 0").format(relation(drops, "group_id"))
    where = f"method {method!r} declares the groups it never trains in {drops!r} (Method.drops)"
    try:
        with store.transaction() as conn:
            conn.execute(probe)
    except psycopg.errors.UndefinedTable:
        raise ReflexdbError(f"{where}, but the database has no such view: its migration branch creates it "
                            "(run `reflexdb db upgrade` with the method's package installed)") from None
    except psycopg.errors.UndefinedColumn:
        raise ReflexdbError(f"{where}, but it has no column group_id: admission control and the learner read "
                            "the group ids there") from None
    except psycopg.errors.InsufficientPrivilege:
        raise ReflexdbError(f"{where}, but this login may not read it: the method's sql/roles.sql grants SELECT "
                            "on it to reflexdb_collector (then run `reflexdb db roles`)") from None


def steps_until_consumed(ahead: int, groups_per_step: int, imported_per_step: int, imported_left: int) -> int:
    """Learner steps that pass before a fresh group with ``ahead`` unconsumed fresh groups before it
    is taken (0: the next step), when each step takes ``imported_per_step`` of the
    ``imported_left`` remaining imported group uses while they last and fresh groups for the rest.

    Example: G = 4, k = 3, 5 imported uses left: 2 steps take imports (3, then 2; counted as G − k
    = 1 fresh each, a bound: the last one may take more), so with 6 fresh groups ahead the group
    waits 2 steps for the 2 fresh groups those take, then (6 − 2) // 4 = 1 more: 3.
    """
    G, k = groups_per_step, imported_per_step
    ahead = max(0, ahead)
    if k <= 0 or imported_left <= 0:
        return ahead // G
    with_imports = -(-imported_left // k)  # ceil: steps that still take imported groups
    fresh_then = with_imports * (G - k)
    if ahead < fresh_then:
        return ahead // (G - k)
    return with_imports + (ahead - fresh_then) // G
