"""The experience store: the one channel between collectors and the learner.

Typical use::

    from reflexdb import Store, GroupIn, TrajectoryIn

    with Store.open() as store:                   # embedded server unless a URL is configured
        run = store.create_run("demo")
        [task] = store.add_tasks(run, [TaskIn(prompt="2+3=?", ground_truth="5")])
        written = store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0,
                                            trajectories=[TrajectoryIn(...), ...]))
        [group] = store.read_groups([written.group_id])   # payloads as numpy arrays

A group is written in one transaction with binary COPY: it becomes visible all at once or not
at all. ``NOTIFY reflexdb_groups`` / ``reflexdb_policy`` wake waiting processes; waits always
poll as well, so a lost notification delays a waiter but never stalls it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
import psycopg.adapt
import psycopg.pq
import sqlalchemy.exc
from psycopg.types.json import Jsonb
from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from . import drill, migrate, schema
from . import origins as origins_table
from .attachments import work_items
from .db import connect_raw, make_engine
from .errors import InvalidGroup, NotFound, ReflexdbError
from .origins import GroupKind, Origin
from .records import (
    Group,
    GroupIn,
    PolicyVersion,
    Sibling,
    TaskIn,
    TokenSignals,
    Trajectory,
    Turn,
    WrittenGroup,
)
from .sqlfile import load_queries
from .validate import PreparedGroup, check_siblings, prepare_group

log = logging.getLogger(__name__)
Q = load_queries()

GROUPS_CHANNEL = "reflexdb_groups"
POLICY_CHANNEL = "reflexdb_policy"

_TRAJ_COLUMNS = (
    "id", "group_id", "run_id", "task_id", "index_in_group", "origin", "parent_trajectory_id",
    "policy_version", "reward", "correct", "truncated", "finish_reason",
    "extracted_answer", "confidence", "num_turns", "response_length", "error", "meta",
)
_TRAJ_TYPES = (
    "int8", "int8", "int8", "int8", "int2", "text", "int8", "int4", "float8", "bool",
    "bool", "text", "text", "float8", "int2", "int4", "text", "jsonb",
)
# The per-trajectory tables carry the trajectory's run_id last (their partition key, 0015).
_TURN_COLUMNS = ("trajectory_id", "turn_index", "role", "text", "token_start", "token_end", "trainable", "tool_error",
                 "attempt", "answer", "correct", "reward", "tool_call", "run_id")
_TURN_TYPES = ("int8", "int2", "text", "text", "int4", "int4", "bool", "bool", "int2", "text", "bool", "float8", "jsonb",
               "int8")
_PAYLOAD_COLUMNS = ("trajectory_id", "prompt_ids", "response_ids", "logprobs", "token_policy_versions", "loss_mask",
                    "run_id")
_PAYLOAD_TYPES = ("int8", "bytea", "bytea", "bytea", "bytea", "bytea", "int8")
# token_bytes holds each array as its little-endian bytes (docs/store.md, "Payload format").
_PAYLOAD_DTYPES = (np.dtype("<i4"), np.dtype("<i4"), np.dtype("<f4"), np.dtype("<i4"), np.dtype(np.bool_))
_EMBED_COLUMNS = ("trajectory_id", "model", "layer", "dim", "vector", "run_id")
_EMBED_TYPES = ("int8", "text", "int4", "int4", "float4[]", "int8")


RUN_CREATION_LOCK = 0x7265666C  # pg_advisory_xact_lock key: "refl"
RUN_CREATION_LOCK_TIMEOUT = "250ms"  # under deadlock_timeout (1 s): the run creation gives way, never a writer
RUN_CREATION_RETRY_S = 60.0


def lock_run_creation(conn) -> None:
    """Prepare a transaction to insert a run (``create_run``, ``reflexdb db restore``).

    Inserting a run creates its partitions (create_run_partitions), and a partition's foreign keys
    take SHARE ROW EXCLUSIVE locks on the tables they refer to (runs, groups, tasks, hints,
    reflections, trajectories, learner_steps): the very tables collectors and learners of other runs
    hold ROW EXCLUSIVE on while they write. Two hazards, two locks:

    - two transactions inserting runs at once deadlock on ``runs``: a transaction-scoped advisory
      lock, taken before the insert, makes the second one wait instead;
    - a writer that holds one of those tables and then wants one the run creation took would
      deadlock with it, and PostgreSQL might abort the writer: ``lock_timeout`` makes the run
      creation give up first (LockNotAvailable), long before the deadlock check, so the caller
      retries it and writers never fail.

    ``conn`` is a SQLAlchemy or a psycopg connection."""
    sqls = (f"SELECT pg_advisory_xact_lock({RUN_CREATION_LOCK})",
            f"SET LOCAL lock_timeout = '{RUN_CREATION_LOCK_TIMEOUT}'")
    for sql in sqls:
        if isinstance(conn, psycopg.Connection):
            conn.execute(sql)
        else:
            conn.exec_driver_sql(sql)


def _lock_not_available(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.errors.LockNotAvailable) or isinstance(
        getattr(exc, "orig", None), psycopg.errors.LockNotAvailable)


def payload_bytes(array: np.ndarray | None, dtype: np.dtype) -> bytes | None:
    """A per-token array as stored in ``token_bytes``: its values as ``dtype`` (little-endian), raw."""
    return None if array is None else np.ascontiguousarray(array, dtype=dtype).tobytes()


#: ``token_signals``' arrays (advantage, log_ratio, clipped, entropy) as stored (revision 0028).
_SIGNAL_DTYPES = (np.dtype("<f2"), np.dtype("<f2"), np.dtype(np.bool_), np.dtype("<f2"))


def signal_bytes(signals: TokenSignals) -> tuple[bytes | None, ...]:
    """A row's :class:`TokenSignals` as ``token_signals`` stores them: float16 and one byte per flag,
    little-endian. A float past float16's range (±65504) is stored as ±inf."""
    values = (signals.advantage, signals.log_ratio, signals.clipped, signals.entropy)
    with np.errstate(over="ignore"):
        return tuple(None if v is None else np.ascontiguousarray(v, dtype=d).tobytes()
                     for v, d in zip(values, _SIGNAL_DTYPES))


def signal_arrays(values: Sequence) -> TokenSignals:
    """``token_signals``' four columns (bytes-like, or None) as a :class:`TokenSignals` of float32
    and bool arrays."""
    a, r, c, e = (None if v is None else np.frombuffer(v, dtype=d) for v, d in zip(values, _SIGNAL_DTYPES))
    as32 = (lambda x: None if x is None else x.astype(np.float32))
    return TokenSignals(advantage=as32(a), log_ratio=as32(r), clipped=c, entropy=as32(e))


def payload_arrays(values: Sequence) -> tuple[np.ndarray | None, ...]:
    """The five ``token_bytes`` columns (bytes-like, or None) as numpy arrays, without a per-element decode.

    Each array views a writable buffer of its own (the bytea loader gives a ``bytearray``).
    """
    return tuple(None if v is None else np.frombuffer(v, dtype=d) for v, d in zip(values, _PAYLOAD_DTYPES))


class _BytearrayLoader(psycopg.adapt.Loader):
    """Binary ``bytea`` as a writable ``bytearray``, so that numpy arrays viewing it are writable too."""

    format = psycopg.pq.Format.BINARY

    def load(self, data) -> bytearray:
        return bytearray(data)


def _copy_sql(table: str, columns: Sequence[str]) -> str:
    return f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"


def copy_rows(cur: psycopg.Cursor, table: str, columns: Sequence[str], types: Sequence[str], rows: Iterable) -> None:
    """Binary COPY ``rows`` into ``table``; numpy arrays go through :mod:`reflexdb.codecs`."""
    with cur.copy(_copy_sql(table, columns)) as cp:
        cp.set_types(list(types))
        for row in rows:
            cp.write_row(row)


class _Rows:
    """COPY rows of the groups written in one transaction, one list per table."""

    def __init__(self) -> None:
        self.trajectories: list[tuple] = []
        self.turns: list[tuple] = []
        self.payloads: list[tuple] = []
        self.embeddings: list[tuple] = []

    def copy(self, cur: psycopg.Cursor) -> None:
        copy_rows(cur, "trajectories", _TRAJ_COLUMNS, _TRAJ_TYPES, self.trajectories)
        if self.turns:
            copy_rows(cur, "turns", _TURN_COLUMNS, _TURN_TYPES, self.turns)
        copy_rows(cur, "token_bytes", _PAYLOAD_COLUMNS, _PAYLOAD_TYPES, self.payloads)
        if self.embeddings:
            copy_rows(cur, "embeddings", _EMBED_COLUMNS, _EMBED_TYPES, self.embeddings)


class Store:
    """A connection to the experience store (one SQLAlchemy engine, pooled).

    Args:
        engine: an engine from :func:`reflexdb.db.make_engine`.
        synchronous_commit: ``False`` (default) lets group writes return before the WAL is
            flushed to disk: a crash can lose the last few hundred milliseconds of groups, but a
            group is still all-or-nothing. ``True`` waits for the flush (PostgreSQL's default).
    """

    def __init__(self, engine: Engine, *, synchronous_commit: bool = False):
        self.engine = engine
        self.url = engine.url.render_as_string(hide_password=False)
        self.synchronous_commit = synchronous_commit
        self._embedding_dims: dict[int, int] = {}
        self._claimed_dims: dict[int, int] = {}
        self._origins: dict[str, Origin] | None = None
        self._kinds: dict[str, GroupKind] | None = None

    @classmethod
    def open(cls, url: str | None = None, *, check_schema: bool = True, create_schema: bool = False,
             **kwargs) -> Store:
        """Connect to ``url`` (default: the configured database or the embedded server).

        Args:
            create_schema: create the schema if the database has none yet (a new database). An
                existing schema at another revision is never migrated here: that stays an explicit
                ``reflexdb db upgrade``.

        Raises:
            DatabaseUnavailable: the server cannot be reached.
            SchemaOutdated: the schema is not at this code's revision (run ``reflexdb db upgrade``).
        """
        engine = make_engine(url)
        if check_schema:
            try:
                if create_schema:
                    with engine.connect() as conn:
                        empty = migrate.current_revision(conn) is None
                    if empty:
                        migrate.upgrade(engine)
                migrate.check_current(engine)
            except ReflexdbError:
                engine.dispose()
                raise
        return cls(engine, **kwargs)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def transaction(self):
        """A pooled psycopg connection inside one transaction: committed when the block ends,
        rolled back if it raises. The door for modules with SQL of their own (``reflexdb/sql/*.sql``:
        work claims, replay requests, hint stages, reflections, the learner's bookkeeping)::

            with store.transaction() as conn:
                conn.execute(Q["claim_tasks"], {...}).fetchall()

        ``conn`` is a ``psycopg.Connection`` (psycopg 3, not SQLAlchemy): parameters are
        ``%(name)s`` placeholders with a dict, ``conn.cursor().executemany(sql, [dict, ...])``
        writes many rows.
        """
        with self.engine.begin() as conn:
            yield conn.connection.driver_connection

    # ------------------------------------------------------------------ runs and settings

    def origins(self, *, refresh: bool = False) -> dict[str, Origin]:
        """The table of origins (reflexdb/origins.py): name -> :class:`Origin`, read once per store
        (again with ``refresh``: a method's migration may add origins while processes run)."""
        if self._origins is None or refresh:
            with self.engine.connect() as conn:
                self._origins = {r[0]: Origin(*r) for r in conn.execute(text(origins_table.SELECT))}
        return self._origins

    def group_kinds(self, *, refresh: bool = False) -> dict[str, GroupKind]:
        """The table of group kinds (reflexdb/origins.py): name -> :class:`GroupKind`, read once per
        store (again with ``refresh``)."""
        if self._kinds is None or refresh:
            with self.engine.connect() as conn:
                self._kinds = {r[0]: GroupKind(*r) for r in conn.execute(text(origins_table.KINDS_SELECT))}
        return self._kinds

    def create_run(self, name: str, *, algorithm: str | None = None, config: dict | None = None) -> int:
        """Create run ``name`` if it does not exist; return its id."""
        stmt = (
            pg_insert(schema.runs)
            .values(name=name, algorithm=algorithm, config=config or {})
            .on_conflict_do_nothing(index_elements=["name"])
        )
        existing = select(schema.runs.c.id).where(schema.runs.c.name == name)

        def attempt() -> int:
            with self.engine.begin() as conn:
                rid = conn.execute(existing).scalar()
                if rid is not None:
                    return rid
                lock_run_creation(conn)  # one run created at a time; it gives way to writers
                conn.execute(stmt)
                return conn.execute(existing).scalar_one()

        try:
            for tried in Retrying(retry=retry_if_exception(_lock_not_available),
                                  stop=stop_after_delay(RUN_CREATION_RETRY_S),
                                  wait=wait_random_exponential(multiplier=0.05, max=2), reraise=True):
                with tried:
                    return attempt()
        except sqlalchemy.exc.OperationalError as exc:
            if _lock_not_available(exc):
                raise ReflexdbError(
                    f"could not create run {name!r}: other transactions kept its tables locked for "
                    f"{RUN_CREATION_RETRY_S:.0f}s (a long write or a manual LOCK); nothing was written") from None
            raise
        raise AssertionError("unreachable")

    def record_embedding_dim(self, run_id: int, dim: int, model: str) -> int:
        """Record the run's embedding dimension ``dim`` (the model's hidden size) unless one is
        recorded already; return the run's. The learner does it at start, so that collectors whose
        login may not update runs (the collector role) find it."""
        with self.transaction() as conn:
            row = conn.execute(Q["claim_embedding_dim"], {"dim": dim, "model": model, "run_id": run_id}).fetchone() \
                or conn.execute(Q["run_embedding_dim"], {"run_id": run_id}).fetchone()
        if row is None:
            raise NotFound(f"no run with id {run_id}")
        return row[0]

    def run_id(self, name: str) -> int:
        with self.engine.connect() as conn:
            rid = conn.execute(select(schema.runs.c.id).where(schema.runs.c.name == name)).scalar()
        if rid is None:
            raise NotFound(f"no run named {name!r}")
        return rid

    def set_settings(self, run_id: int, settings: dict[str, Any]) -> None:
        """Upsert per-run settings (read by the SQL views). Values must be JSON-serialisable."""
        if not settings:
            return
        rows = [{"run_id": run_id, "key": k, "value": v} for k, v in settings.items()]
        stmt = pg_insert(schema.run_settings).values(rows)
        stmt = stmt.on_conflict_do_update(
            index_elements=["run_id", "key"], set_={"value": stmt.excluded.value, "updated_at": func.now()}
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)

    def get_settings(self, run_id: int) -> dict[str, Any]:
        t = schema.run_settings
        with self.engine.connect() as conn:
            return dict(conn.execute(select(t.c.key, t.c.value).where(t.c.run_id == run_id)).all())

    # ------------------------------------------------------------------ tasks

    def add_tasks(self, run_id: int, tasks: Iterable[TaskIn]) -> list[int]:
        """Add tasks to a run (idempotent on ``(dataset, split, task_key)``); return their ids in order."""
        rows = []
        for task in tasks:
            key = task.task_key or hashlib.sha256(task.prompt.encode()).hexdigest()[:32]
            rows.append(
                {"run_id": run_id, "dataset": task.dataset, "split": task.split, "task_key": key,
                 "prompt": task.prompt, "ground_truth": task.ground_truth, "meta": task.meta}
            )
        if not rows:
            return []
        t = schema.tasks
        with self.engine.begin() as conn:
            for start in range(0, len(rows), 5000):
                conn.execute(pg_insert(t).values(rows[start : start + 5000]).on_conflict_do_nothing())
            found = conn.execute(
                text(
                    "SELECT k.id FROM unnest(CAST(:ds AS text[]), CAST(:sp AS text[]), CAST(:ky AS text[])) "
                    "WITH ORDINALITY AS x(ds, sp, ky, i) "
                    "JOIN tasks k ON k.run_id = :run AND k.dataset = x.ds AND k.split = x.sp AND k.task_key = x.ky "
                    "ORDER BY x.i"
                ),
                {"run": run_id, "ds": [r["dataset"] for r in rows], "sp": [r["split"] for r in rows],
                 "ky": [r["task_key"] for r in rows]},
            ).scalars().all()
        return list(found)

    # ------------------------------------------------------------------ writing groups

    def write_group(self, group: GroupIn, *, complete_claim: str | None = None) -> WrittenGroup:
        """Validate and write one group atomically (binary COPY, one transaction).

        Args:
            group: the group, with its attachments (``reflexdb/attachments.py``).
            complete_claim: the writer's name (a collector's): in the same transaction the group
                completes the work item held under it (its attachment that is a claim, else its
                task's claim: released, ``tasks.times_collected`` counted). ``None``: no claim.

        Raises:
            InvalidGroup: naming the offending field; nothing of the group is written.
            ClaimLost: the group's work item is no longer the writer's; nothing is written.
        """
        return self.write_groups([group], complete_claim=complete_claim)[0]

    def write_groups(self, groups: Sequence[GroupIn], *, complete_claim: str | None = None) -> list[WrittenGroup]:
        """Write several groups in one transaction: all become visible together, or none.

        In the transaction: every group's attachments' ``before`` step, the groups and their
        trajectories (one COPY per table), then every group's work items' ``after`` step
        (``reflexdb/attachments.py``; a task's claim is completed once, however many of its groups
        the write holds). A trajectory's parent may be a :class:`~reflexdb.records.Sibling`, a
        trajectory of the same write whose id is not known yet.

        Raises:
            InvalidGroup: naming the offending field; nothing is written.
            ClaimLost: a group's work item (a replay request, a hint stage, ...) is no longer
                ``complete_claim``'s; nothing is written.
        """
        names = {t.origin for g in groups for t in g.trajectories}
        known = self.origins(refresh=not names <= set(self._origins or ()))  # a migration may have added some
        kinds = self.group_kinds(refresh=not {g.kind for g in groups} <= set(self._kinds or ()))
        prepared = [prepare_group(g, known, kinds) for g in groups]
        check_siblings(prepared)
        self._claimed_dims = {}
        try:
            written = self._write_all(prepared, groups, complete_claim)
        except BaseException:
            self._claimed_dims = {}
            raise
        self._embedding_dims.update(self._claimed_dims)  # committed: safe to remember
        return written

    def written_keys(self, keys: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Which of ``keys`` are the ``write_key`` of a group already written."""
        if not keys:
            return set()
        with self.transaction() as conn:
            return {k for k, _, _ in conn.execute(Q["groups_by_write_key"], {"keys": list(keys)}).fetchall()}

    def complete(self, attachments: Sequence, *, collector: str | None) -> None:
        """A work item that ends without a group (e.g. a hint stage none of whose extra rollouts was
        correct): its attachments' ``before`` and ``after`` steps (``written`` None), one transaction.

        Raises:
            ClaimLost: the work item is no longer ``collector``'s; nothing is written.
        """
        with self.transaction() as conn:
            cur = conn.cursor()
            for a in attachments:
                a.before(cur)
            for a in attachments:
                a.after(cur, None, collector)

    def _write_all(self, prepared: list[PreparedGroup], groups: Sequence[GroupIn],
                   complete_claim: str | None) -> list[WrittenGroup]:
        try:
            with self.transaction() as conn:
                cur = conn.cursor()
                # BEGIN, SET LOCAL, the attachments' first rows and one INSERT of every group travel
                # in one round trip (errors surface when the pipeline syncs, in statement order).
                with conn.pipeline():
                    if not self.synchronous_commit:
                        conn.execute("SET LOCAL synchronous_commit = off")
                    pre = conn.cursor()  # its own cursor: `cur` must hold the INSERT's ids below
                    for g in groups:  # rows the trajectories refer to come first
                        for a in g.attachments:
                            a.before(pre)
                    if prepared:
                        self._insert_groups(cur, prepared)
                drill.phase("write")  # inside the transaction: a kill here must leave nothing
                _check_parents(conn, prepared)
                # One INSERT for all the groups' ids; then one COPY per table for all the groups.
                inserted: list[list[tuple]] = [[] for _ in prepared]
                for k, group_id, tid in (cur.fetchall() if prepared else ()):
                    inserted[k - 1].append((group_id, tid))
                ids = [[r[1] for r in rows] for rows in inserted]  # lineage to a Sibling resolves here
                rows = _Rows()
                written = [self._group_rows(p, got, rows, ids) for p, got in zip(prepared, inserted)]
                rows.copy(cur)
                for k, a in work_items(groups):  # work items completed, rows that refer to the groups
                    a.after(cur, written[k], complete_claim)
                return written
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "uq_groups_write_key":
                raise
            return self._already_written(groups)
        except psycopg.errors.ForeignKeyViolation as exc:
            raise InvalidGroup(_fk_field(exc), f"refers to a row that does not exist ({exc.diag.message_detail})") from None
        except psycopg.errors.CheckViolation as exc:
            raise InvalidGroup(exc.diag.constraint_name or "?", exc.diag.message_primary or str(exc)) from None

    def _already_written(self, groups: Sequence[GroupIn]) -> list[WrittenGroup]:
        """The groups an earlier attempt of this write committed (same ``write_key``s).

        A write is one transaction, so either every group of it exists or none does; a partial
        match means two different writes shared a key, which is refused.
        """
        keys = [g.write_key for g in groups]
        with self.transaction() as conn:
            found = {k: WrittenGroup(gid, tuple(tids))
                     for k, gid, tids in conn.execute(Q["groups_by_write_key"], {"keys": keys}).fetchall()}
        if len(found) != len(keys):
            raise InvalidGroup("write_key", f"{len(found)} of the {len(keys)} groups' write keys belong to groups "
                                            "already written; a GroupIn must not be reused for a different group")
        log.info("%d group(s) were already written by an earlier attempt whose commit was not acknowledged",
                 len(keys))
        return [found[k] for k in keys]

    def _check_embedding_dim(self, cur: psycopg.Cursor, p: PreparedGroup) -> None:
        if p.embedding_dim is None:
            return
        run_id = p.src.run_id
        dim = self._embedding_dims.get(run_id) or self._claimed_dims.get(run_id)
        if dim is None:
            # read first: a login that may not update runs (the collector role) finds it recorded by the learner
            row = cur.execute(Q["run_embedding_dim"], {"run_id": run_id}).fetchone()
            if row is not None and row[0] is None:
                row = cur.execute(
                    Q["claim_embedding_dim"], {"dim": p.embedding_dim, "model": p.src.embedding_model, "run_id": run_id}
                ).fetchone() or cur.execute(Q["run_embedding_dim"], {"run_id": run_id}).fetchone()
            if row is None:
                raise InvalidGroup("run_id", f"run {run_id} does not exist")
            dim = row[0]  # cached by write_groups only once this transaction has committed
            self._claimed_dims[run_id] = dim
        if dim != p.embedding_dim:
            i = next(i for i, t in enumerate(p.trajectories) if t.embedding is not None)
            raise InvalidGroup(
                f"trajectories[{i}].embedding", f"dimension {p.embedding_dim} != the run's embedding dimension {dim}"
            )

    def _insert_groups(self, cur: psycopg.Cursor, prepared: Sequence[PreparedGroup]) -> psycopg.Cursor:
        """Check the embedding dimensions and execute ``insert_groups`` (rows: the group's position
        in ``prepared`` from 1, its id, one trajectory id each)."""
        for p in prepared:
            self._check_embedding_dim(cur, p)
        gs = [p.src for p in prepared]
        return cur.execute(
            Q["insert_groups"],
            {"run_ids": [g.run_id for g in gs], "task_ids": [g.task_id for g in gs],
             "workflows": [g.workflow for g in gs], "kinds": [g.kind for g in gs],
             "versions": [int(g.policy_version) for g in gs], "sizes": [len(p.trajectories) for p in prepared],
             "collectors": [g.collector for g in gs], "metas": [Jsonb(g.meta) for g in gs],
             "keys": [g.write_key for g in gs]},
        )

    @staticmethod
    def _group_rows(p: PreparedGroup, inserted: list[tuple], out: _Rows,
                    write_ids: Sequence[Sequence[int]] = ()) -> WrittenGroup:
        """Add the COPY rows of a group (``insert_group`` returned ``inserted``) to ``out``;
        ``write_ids``: the trajectory ids of every group of the write, for a :class:`Sibling` parent."""
        g = p.src
        group_id = inserted[0][0]
        ids = [r[1] for r in inserted]
        for i, (tid, t) in enumerate(zip(ids, p.trajectories)):
            s = t.src
            parent = s.parent_trajectory_id
            if isinstance(parent, Sibling):
                parent = write_ids[parent.group][parent.index]
            out.trajectories.append((
                tid, group_id, g.run_id, g.task_id, i, s.origin, parent, t.policy_version, t.reward, s.correct, t.truncated, s.finish_reason,
                s.extracted_answer, t.confidence, max(1, len(t.turns)), t.response_ids.shape[0], s.error,
                Jsonb(s.meta),
            ))
            for k, u in enumerate(t.turns):
                out.turns.append((tid, k, u.role, u.text, u.token_start, u.token_end, u.trainable, u.tool_error,
                                  u.attempt, u.answer, u.correct, u.reward,
                                  None if u.tool_call is None else Jsonb(u.tool_call), g.run_id))
            out.payloads.append((tid, *(payload_bytes(a, d) for a, d in zip(
                (t.prompt_ids, t.response_ids, t.logprobs, t.token_policy_versions, t.loss_mask), _PAYLOAD_DTYPES)),
                g.run_id))
            if t.embedding is not None:
                out.embeddings.append((tid, g.embedding_model, g.embedding_layer, t.embedding.shape[0], t.embedding,
                                       g.run_id))
        return WrittenGroup(group_id, tuple(ids))

    # ------------------------------------------------------------------ reading

    def read_groups(
        self, group_ids: Sequence[int], *, payloads: bool = True, turns: bool = True, embeddings: bool = False
    ) -> list[Group]:
        """Read groups with their trajectories, in the order of ``group_ids``.

        Raises:
            NotFound: a group id does not exist.
        """
        ids = [int(i) for i in group_ids]
        if not ids:
            return []
        with self.transaction() as conn:
            cur = conn.cursor(binary=True)
            grows = {r[0]: r for r in cur.execute(Q["select_groups"], {"ids": ids}).fetchall()}
            missing = [i for i in ids if i not in grows]
            if missing:
                raise NotFound(f"no group with id {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            runs = sorted({r[1] for r in grows.values()})  # the partitions to read (run_id: rows' 2nd column)
            trows = cur.execute(Q["select_trajectories_of_groups"], {"ids": ids, "runs": runs}).fetchall()
            trajs = self._assemble(cur, trows, payloads, turns, embeddings)
        by_group: dict[int, list[Trajectory]] = {}
        for t in trajs:
            by_group.setdefault(t.group_id, []).append(t)
        return [Group(*grows[i], trajectories=tuple(by_group.get(i, ()))) for i in ids]

    def read_trajectories(
        self, trajectory_ids: Sequence[int], *, payloads: bool = True, turns: bool = True, embeddings: bool = False
    ) -> list[Trajectory]:
        """Read trajectories by id, in the order given.

        Raises:
            NotFound: an id does not exist.
        """
        ids = [int(i) for i in trajectory_ids]
        if not ids:
            return []
        with self.transaction() as conn:
            cur = conn.cursor(binary=True)
            trows = cur.execute(Q["select_trajectories"], {"ids": ids}).fetchall()
            found = {r[0] for r in trows}
            missing = [i for i in ids if i not in found]
            if missing:
                raise NotFound(f"no trajectory with id {missing[0]}")
            trajs = {t.id: t for t in self._assemble(cur, trows, payloads, turns, embeddings)}
        return [trajs[i] for i in ids]

    def _assemble(self, cur, trows, payloads: bool, turns: bool, embeddings: bool) -> list[Trajectory]:
        ids = [r[0] for r in trows]
        runs = sorted({r[2] for r in trows})  # partition pruning: only these runs' partitions are read
        extra: dict[int, dict[str, Any]] = {i: {} for i in ids}
        names = _PAYLOAD_COLUMNS[1:6]
        other_half = None
        # fetchall() loads every row in one call (much cheaper than iterating the cursor row by row)
        if payloads and ids:
            mine = ids
            if len(ids) >= _PARALLEL_PAYLOADS_MIN and self._spare_connection():
                # Payloads are most of a read's work: the server sends arrays element by element
                # and the client decodes them. Fetch half on a second pooled connection in a
                # helper thread so both halves are produced (two backends) and decoded at once.
                # Every statement takes its own snapshot either way (READ COMMITTED), so what a
                # read can see is unchanged.
                half = len(ids) // 2
                other_half = _in_thread(self._payload_rows, ids[half:], runs)
                mine = ids[:half]
            for tid, *arrays in _payload_cursor(cur).execute(Q["select_payloads"],
                                                             {"ids": mine, "runs": runs}).fetchall():
                extra[tid].update(zip(names, payload_arrays(arrays)))
        if embeddings and ids:
            for tid, vector in cur.execute(Q["select_embeddings"], {"ids": ids, "runs": runs}).fetchall():
                extra[tid]["embedding"] = vector
        if turns and ids:
            acc: dict[int, list[Turn]] = {}
            for tid, *fields in cur.execute(Q["select_turns"], {"ids": ids, "runs": runs}).fetchall():
                ts = acc.get(tid)
                if ts is None:
                    ts = acc[tid] = []
                ts.append(Turn(*fields))
            for tid, ts in acc.items():
                extra[tid]["turns"] = tuple(ts)
        if other_half is not None:
            for tid, *arrays in other_half():
                extra[tid].update(zip(names, payload_arrays(arrays)))
        # the SELECT's column order is Trajectory's field order
        return [Trajectory(*r, **extra[r[0]]) for r in trows]

    def _payload_rows(self, ids: list[int], runs: list[int]) -> list[tuple]:
        """``select_payloads`` for ``ids`` on a connection of its own (see :meth:`_assemble`)."""
        with self.transaction() as conn:
            return _payload_cursor(conn.cursor(binary=True)).execute(Q["select_payloads"],
                                                                     {"ids": ids, "runs": runs}).fetchall()

    def _spare_connection(self) -> bool:
        """Whether the pool has a connection to lend without going into overflow or waiting."""
        pool = self.engine.pool
        try:
            return pool.checkedout() < pool.size()
        except AttributeError:  # a pool class without these counters
            return False

    # ------------------------------------------------------------------ policy versions

    def publish_policy(
        self, run_id: int, version: int, checkpoint_uri: str, *, sha256: str | None = None, step: int = 0,
        meta: dict | None = None, manifest_sha256: str | None = None,
    ) -> PolicyVersion:
        """Record a new policy version and NOTIFY collectors (delivered when the row commits).

        ``sha256``: of the weights (:func:`reflexdb.storage.weights_sha256`); ``manifest_sha256``: of
        the ``manifest.json`` uploaded with a version in object storage (:func:`reflexdb.storage.upload`),
        through which collectors check every file of it."""
        try:
            with self.transaction() as conn:
                row = conn.execute(
                    Q["insert_policy"],
                    {"run_id": run_id, "version": version, "checkpoint_uri": checkpoint_uri, "sha256": sha256,
                     "step": step, "meta": Jsonb(meta or {}), "manifest_sha256": manifest_sha256},
                ).fetchone()
        except psycopg.errors.UniqueViolation:
            row = None
        except psycopg.errors.ForeignKeyViolation:
            raise NotFound(f"no run with id {run_id}") from None
        if row is None:
            # The same version again is a retry whose first commit was not acknowledged; another
            # version under the same number is an error.
            existing = self.get_policy(run_id, version)
            if (existing.checkpoint_uri, existing.sha256, existing.step, existing.manifest_sha256) != (
                    checkpoint_uri, sha256, step, manifest_sha256):
                raise ReflexdbError(f"run {run_id} already has policy version {version}")
            return existing
        return PolicyVersion(*row)

    def latest_policy(self, run_id: int, *, with_state: bool = False) -> PolicyVersion | None:
        """The newest policy version of a run; ``with_state``: the newest with a learner state
        (``learner.state_every``: where resume starts)."""
        with self.transaction() as conn:
            row = conn.execute(Q["latest_state_policy" if with_state else "latest_policy"],
                               {"run_id": run_id}).fetchone()
        return PolicyVersion(*row) if row else None

    def attach_state(self, run_id: int, version: int, state_dir: str, tag: str) -> None:
        """Record the learner state written for an already published version (``state_dir``/``tag``)."""
        with self.transaction() as conn:
            conn.execute(Q["attach_state"], {"meta": Jsonb({"learner_state": state_dir, "state_tag": tag}),
                                             "run_id": run_id, "version": version})

    def recent_state_tags(self, run_id: int, k: int) -> set[str]:
        """The learner-state tags of a run's newest ``k`` versions that have one."""
        with self.transaction() as conn:
            return {r[0] for r in conn.execute(Q["recent_state_tags"], {"run_id": run_id, "k": k})}

    def get_policy(self, run_id: int, version: int) -> PolicyVersion:
        t = schema.policy_versions
        with self.engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.run_id == run_id, t.c.version == version)).first()
        if row is None:
            raise NotFound(f"run {run_id} has no policy version {version}")
        return PolicyVersion(*row)

    # ------------------------------------------------------------------ waiting

    def newest_group_id(self, run_id: int) -> int:
        """The id of the run's newest group (0 when it has none)."""
        with self.transaction() as conn:
            return int(conn.execute(Q["newest_group"], {"run_id": run_id}).fetchone()[0])

    def wait_for_groups(
        self, run_id: int, after_group_id: int, *, min_count: int = 1, timeout: float | None = None,
        poll_interval: float = 2.0, limit: int = 10_000,
    ) -> list[int]:
        """Block until the run has ``min_count`` groups with id > ``after_group_id``.

        Returns the ids found (possibly fewer than ``min_count`` if ``timeout`` expired).
        """

        def check(conn):
            rows = conn.execute(Q["groups_after"], {"run_id": run_id, "after": after_group_id, "limit": limit})
            ids = [r[0] for r in rows]
            return ids if len(ids) >= min_count else None, ids

        return self._wait(GROUPS_CHANNEL, check, timeout, poll_interval)

    def wait_for_policy(
        self, run_id: int, after_version: int, *, timeout: float | None = None, poll_interval: float = 2.0
    ) -> PolicyVersion | None:
        """Block until the run has a policy version newer than ``after_version``; ``None`` on timeout."""

        def check(conn):
            row = conn.execute(Q["latest_policy"], {"run_id": run_id}).fetchone()
            pv = PolicyVersion(*row) if row and row[1] > after_version else None
            return pv, pv

        return self._wait(POLICY_CHANNEL, check, timeout, poll_interval)

    def _wait(self, channel: str, check, timeout: float | None, poll_interval: float):
        """LISTEN on ``channel`` and re-run ``check`` on every notification or poll tick.

        ``check(conn)`` returns ``(result_if_done_or_None, partial_result)``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        conn = connect_raw(self.url, autocommit=True)
        try:
            conn.execute(f"LISTEN {channel}")
            while True:
                done, partial = check(conn)
                if done is not None:
                    return done
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return partial
                wait = poll_interval if remaining is None else min(poll_interval, remaining)
                for _ in conn.notifies(timeout=wait, stop_after=1):
                    pass
        finally:
            conn.close()

    # ------------------------------------------------------------------ learner consumption

    def record_step(
        self, run_id: int, step: int, policy_version: int, trajectory_ids: Sequence[int], *,
        loss: float | None = None, metrics: dict[str, float] | None = None, batch_snapshot: str | None = None,
        advantages: Mapping[int, Sequence[float]] | None = None, advantage_stages: Sequence[str] | None = None,
        token_signals: Mapping[int, TokenSignals] | None = None,
    ) -> int:
        """Record learner step ``step`` and the trajectories it consumed; return the step's row id.

        Args:
            batch_snapshot: ``pg_current_snapshot()`` of the query that chose the step's groups
                (view ``untrained_groups``).
            advantages: trajectory id -> its advantage after each of ``advantage_stages``, in order
                (``consumption.advantages``); a consumed trajectory left out gets NULL (a row with
                no advantage, such as a method's auxiliary row). A value that is not finite is
                stored as a NULL element.
            advantage_stages: the stages' names in order (``learner_steps.advantage_stages``),
                e.g. ``["group", "clamp_negative"]``; required with ``advantages``.
            token_signals: trajectory id -> what the step's loss used at each of its response
                tokens (table ``token_signals``, revision 0028), written in the same transaction;
                a consumed trajectory left out gets no row.

        Recording the same step with the same trajectories again returns the recorded row: a
        retry after a commit whose acknowledgement was lost is not an error.

        Raises:
            ValueError: ``advantages`` without ``advantage_stages``, for a trajectory not consumed,
                or with a number of values other than the number of stages; ``token_signals`` for
                a trajectory not consumed, or with arrays of different lengths.
            NotFound: a trajectory id does not exist (nothing is recorded).
            ReflexdbError: the run already has this step, with other trajectories.
        """
        ids = sorted({int(i) for i in trajectory_ids})
        stages = None if advantage_stages is None else [str(n) for n in advantage_stages]
        adv_ids, adv_values = _flat_advantages(advantages or {}, stages, set(ids))
        signals = _signal_columns(token_signals or {}, set(ids))
        try:
            with self.transaction() as conn:
                step_id, n = conn.execute(
                    Q["record_step"],
                    {"run_id": run_id, "step": step, "policy_version": policy_version, "loss": loss,
                     "metrics": Jsonb(metrics or {}), "ids": ids, "batch_snapshot": batch_snapshot,
                     "advantage_stages": stages, "adv_ids": adv_ids, "adv_values": adv_values},
                ).fetchone()
                if n != len(ids):
                    raise NotFound(f"{len(ids) - n} of the {len(ids)} consumed trajectory ids do not exist")
                if signals["ids"]:
                    conn.execute(Q["record_token_signals"], {"step_id": step_id, **signals})
        except psycopg.errors.UniqueViolation:
            with self.transaction() as conn:
                row = conn.execute(Q["step_consumption"], {"run_id": run_id, "step": step}).fetchone()
            if row is not None and [int(i) for i in row[1]] == ids:
                return row[0]
            raise ReflexdbError(f"run {run_id} already recorded step {step}") from None
        return step_id

    def roll_back_steps(self, run_id: int, after: int) -> int:
        """Delete a run's steps after step ``after`` and restore the ``times_sampled`` of what they
        consumed (resume from the last published state); return how many steps were deleted."""
        with self.transaction() as conn:
            conn.execute(Q["roll_back_consumption"], {"run_id": run_id, "step": after})
            return conn.execute(Q["delete_steps_after"], {"run_id": run_id, "step": after}).rowcount

    def add_step_metrics(self, run_id: int, step: int, metrics: dict[str, float]) -> None:
        """Merge metrics computed after a step (a method's hooks) into the step's row."""
        with self.transaction() as conn:
            conn.execute(Q["add_step_metrics"], {"metrics": Jsonb(metrics), "run_id": run_id, "step": step})

    def any_step_metric_above(self, run_id: int, metric: str, threshold: float) -> bool:
        """Whether any surviving step of a run recorded ``metric`` above ``threshold``."""
        with self.transaction() as conn:
            return bool(conn.execute(Q["any_step_metric_above"], {"run_id": run_id, "metric": metric,
                                                                  "threshold": threshold}).fetchone()[0])

    # ------------------------------------------------------------------ inspection

    def table_counts(self) -> dict[str, int]:
        """Exact row counts of every table."""
        names = [t.name for t in schema.full_metadata().sorted_tables]
        sql = " UNION ALL ".join(f"SELECT '{n}', count(*) FROM {n}" for n in names)
        with self.engine.connect() as conn:
            return dict(conn.execute(text(sql)).all())


def _payload_cursor(cur: psycopg.Cursor) -> psycopg.Cursor:
    """``cur`` (binary) with ``bytea`` loading as ``bytearray`` (see :func:`payload_arrays`)."""
    cur.adapters.register_loader("bytea", _BytearrayLoader)
    return cur


#: Reads of at least this many trajectories fetch their payloads on two connections at once.
_PARALLEL_PAYLOADS_MIN = 128


def _in_thread(fn, *args):
    """Start ``fn(*args)`` in a new thread; return a function that joins it and returns (or raises) its result.

    A thread per call, not a pool: nothing to shut down, and safe in processes that fork.
    """
    box: dict[str, Any] = {}

    def run():
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="reflexdb-read", daemon=True)
    thread.start()

    def result():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["result"]

    return result


def _check_parents(conn: psycopg.Connection, prepared: Sequence[PreparedGroup]) -> None:
    """Every parent given by id (not a :class:`Sibling`) exists. ``trajectories.parent_trajectory_id``
    has no foreign key since trajectories are partitioned by run (0015): the store checks it here,
    in the writing transaction; a write without lineage pays nothing.

    Raises:
        InvalidGroup: naming the first trajectory whose parent does not exist.
    """
    given = [(k, i, t.src.parent_trajectory_id) for k, p in enumerate(prepared) for i, t in enumerate(p.trajectories)
             if t.src.parent_trajectory_id is not None and not isinstance(t.src.parent_trajectory_id, Sibling)]
    if not given:
        return
    found = {r[0] for r in conn.execute(Q["existing_trajectories"], {"ids": sorted({int(x) for *_, x in given})})}
    for k, i, parent in given:
        if int(parent) not in found:
            where = f"trajectories[{i}]" if len(prepared) == 1 else f"groups[{k}].trajectories[{i}]"
            raise InvalidGroup(f"{where}.parent_trajectory_id",
                               f"refers to a row that does not exist (no trajectory with id {int(parent)})")


def _fk_field(exc: psycopg.errors.ForeignKeyViolation) -> str:
    detail = exc.diag.message_detail or ""
    for name in ("task_id", "run_id", "parent_trajectory_id"):
        if f"({name})" in detail:
            return name if name in ("task_id", "run_id") else f"trajectories[].{name}"
    return exc.diag.constraint_name or "foreign key"


def _signal_columns(signals: Mapping[int, TokenSignals], consumed: set[int]) -> dict[str, list]:
    """``record_step``'s token signals as the query takes them: one list per column, aligned."""
    cols: dict[str, list] = {"ids": [], "advantage": [], "log_ratio": [], "clipped": [], "entropy": []}
    for tid, sig in sorted(signals.items()):
        if int(tid) not in consumed:
            raise ValueError(f"token signals for trajectory {tid}, which the step does not consume")
        n = len(sig.entropy)
        if any(v is not None and len(v) != n for v in (sig.advantage, sig.log_ratio, sig.clipped)):
            raise ValueError(f"token signals of trajectory {tid}: arrays of different lengths")
        cols["ids"].append(int(tid))
        for name, value in zip(("advantage", "log_ratio", "clipped", "entropy"), signal_bytes(sig)):
            cols[name].append(value)
    return cols


def _flat_advantages(advantages: Mapping[int, Sequence[float]], stages: list[str] | None,
                     consumed: set[int]) -> tuple[list[int], list[float | None]]:
    """``record_step``'s advantages as the query takes them: each trajectory id once per stage, and
    its values in stage order (``None`` for a value that is not finite)."""
    if advantages and stages is None:
        raise ValueError("advantages need advantage_stages: the name of each stage their values follow")
    ids: list[int] = []
    values: list[float | None] = []
    for tid, row in advantages.items():
        tid = int(tid)
        if tid not in consumed:
            raise ValueError(f"advantages of trajectory {tid}, which the step does not consume")
        row = [float(v) for v in row]
        if len(row) != len(stages):
            raise ValueError(f"trajectory {tid} has {len(row)} advantages for {len(stages)} stages "
                             f"({', '.join(stages)})")
        ids += [tid] * len(row)
        values += [v if math.isfinite(v) else None for v in row]
    return ids, values


__all__ = ["Store", "copy_rows", "GROUPS_CHANNEL", "POLICY_CHANNEL"]
