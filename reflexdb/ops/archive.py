"""``reflexdb db archive`` / ``db restore``: a run's rows to Parquet and back, row for row.

Archiving writes every row of the run, one Parquet file per table (through
:func:`reflexdb.export.export`, ordered by primary key), writes ``manifest.json`` (run, schema
revision, row counts, a SHA-256 per file), reads every file back and compares it with the
database row by row, and only then deletes the run from the database::

    DIR/manifest.json
    DIR/runs.parquet  DIR/tasks.parquet  DIR/groups.parquet  DIR/trajectories.parquet
    DIR/turns.parquet DIR/token_bytes.parquet  DIR/embeddings.parquet  ...

Restoring checks the manifest and the files' digests, then inserts every table in one
transaction with the original ids (binary COPY, foreign keys in dependency order), so views,
lineage, consumption, ``reflexdb similar`` (the FAISS index catches up from the table) and
``reflexdb learn`` (policy versions and learner steps) continue as before. Checkpoint files and
the FAISS index stay on disk where they are: archiving frees the database, not the checkpoint
directory (``reflexdb runs delete`` removes those).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import migrate, runs, schema
from .admin import run_processes
from ..errors import NotFound, ReflexdbError

FORMAT = 1
MANIFEST = "manifest.json"

# Every table of reflexdb's own that holds rows of a run: how to select them (``%(run)s`` is the run
# id) and the key that orders them, in the order restore inserts them (foreign keys first). A
# method's tables follow, as its package registers them (``reflexdb.plugins.ARCHIVED``, method by
# method: :func:`tables`); a test checks that every declared table is one of them.
CORE: tuple[tuple[str, str, str], ...] = (
    ("runs", "id = %(run)s", "id"),
    ("run_settings", "run_id = %(run)s", "key"),
    ("tasks", "run_id = %(run)s", "id"),
    ("policy_versions", "run_id = %(run)s", "version"),
    ("groups", "run_id = %(run)s", "id"),
    ("trajectories", "run_id = %(run)s", "id"),
    ("turns", "run_id = %(run)s", "trajectory_id, turn_index"),
    ("token_bytes", "run_id = %(run)s", "trajectory_id"),
    ("embeddings", "run_id = %(run)s", "trajectory_id"),
    ("learner_steps", "run_id = %(run)s", "id"),
    ("consumption", "step_id IN (SELECT id FROM learner_steps WHERE run_id = %(run)s)", "step_id, trajectory_id"),
    ("token_signals", "step_id IN (SELECT id FROM learner_steps WHERE run_id = %(run)s)", "step_id, trajectory_id"),
    ("collectors", "run_id = %(run)s", "id"),
)


def tables() -> list[tuple[str, str, str]]:
    """Every table that holds rows of a run, in restore order: reflexdb's own (:data:`CORE`), then
    each installed method's (``reflexdb.plugins.ARCHIVED``; a plug-in's too)."""
    from ..plugins import ARCHIVED

    return [*CORE, *(t for _, own in ARCHIVED.items() for t in own)]

#: Tables that hold no run's rows (the tables of origins and group kinds, which a run's rows refer
#: to, and of the composed views): not archived; the manifest names the origins and kinds the run's
#: rows use, and restore checks they exist.
SHARED = ("origins", "group_kinds", "composed_views")


class ArchiveError(ReflexdbError):
    """An archive cannot be written or restored (the message says why; nothing was deleted or written)."""

    exit_code = 2


@dataclass(frozen=True)
class ArchiveResult:
    run: str
    run_id: int
    directory: Path
    rows: dict[str, int]
    bytes: int


def _query(table: str, where: str, order: str, run_id: int) -> str:
    return f"SELECT * FROM {table} WHERE {where % {'run': int(run_id)}} ORDER BY {order}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def archive(store, name: str, directory: Path, *, on_table: Callable[[str, int], None] | None = None) -> ArchiveResult:
    """Write run ``name`` to ``directory``, verify the files against the database, then delete the run.

    Raises:
        NotFound: no run of that name.
        ArchiveError: the run is in use (a collector, learner, eval or import of it is connected),
            ``directory`` is not empty, or a file does not read back equal to the database
            (nothing is deleted then).
    """
    from .export import export

    directory = Path(directory).expanduser()
    run_id = store.run_id(name)
    live = run_processes(store, name)
    if live:
        raise ArchiveError(f"run {name!r} is in use: {', '.join(live)}; stop it first (Ctrl-C or SIGTERM stops "
                           "cleanly), then archive")
    if directory.exists() and any(directory.iterdir()):
        raise ArchiveError(f"{directory} is not empty; archive into a new directory")
    directory.mkdir(parents=True, exist_ok=True)
    with store.engine.connect() as conn:
        revision = migrate.current_revision(conn)
    files: dict[str, dict[str, Any]] = {}
    for table, where, order in tables():
        path = directory / f"{table}.parquet"
        stats = export(store.url, _query(table, where, order, run_id), path, with_trajectories=False)
        files[table] = {"rows": stats.rows, "sha256": _sha256(path), "order_by": order}
        if on_table:
            on_table(table, stats.rows)
    _verify_against_database(store, run_id, directory)
    with store.engine.connect() as conn:
        used = sorted(o for (o,) in conn.exec_driver_sql(
            "SELECT DISTINCT origin FROM trajectories WHERE run_id = %(run)s", {"run": run_id}))
        kinds = sorted(k for (k,) in conn.exec_driver_sql(
            "SELECT DISTINCT kind FROM groups WHERE run_id = %(run)s", {"run": run_id}))
    manifest = {"format": FORMAT, "run": name, "run_id": run_id, "schema_revision": revision, "tables": files,
                "origins": used, "group_kinds": kinds}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    runs.delete(store, run_id)  # the run's partitions dropped, then its other rows
    size = sum(p.stat().st_size for p in directory.iterdir())
    return ArchiveResult(name, run_id, directory, {t: f["rows"] for t, f in files.items()}, size)


def _rows_of_file(path: Path):
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=2000):
        yield from batch.to_pylist()


def _verify_against_database(store, run_id: int, directory: Path) -> None:
    """Every file, read back, equals the database's rows (same order, same values; JSON columns,
    text in Parquet, compared as parsed JSON)."""
    from .export import _SCALARS, _plain

    with store.transaction() as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        for table, where, order in tables():
            path = directory / f"{table}.parquet"
            cur = conn.cursor(name=f"reflexdb_verify_{table}")
            cur.execute(_query(table, where, order, run_id))
            file_rows = _rows_of_file(path)
            n = 0
            while batch := cur.fetchmany(2000):
                names = [d.name for d in cur.description]
                is_json = [_SCALARS.get(d.type_code) == "json" for d in cur.description]
                for row in batch:
                    got = next(file_rows, None)
                    same = got is not None and all(
                        _same_json(v, got[c]) if j else _plain(v) == got[c] for c, v, j in zip(names, row, is_json))
                    if not same:
                        raise ArchiveError(f"{path}: row {n} does not equal the database's; nothing was deleted")
                    n += 1
            cur.close()
            if next(file_rows, None) is not None:
                raise ArchiveError(f"{path} has more rows than the database; nothing was deleted")


def _same_json(db_value: Any, file_value: Any) -> bool:
    if db_value is None or file_value is None:
        return db_value is None and file_value is None
    return json.loads(file_value) == db_value


def read_manifest(directory: Path) -> dict[str, Any]:
    directory = Path(directory).expanduser()
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        raise ArchiveError(f"{directory} holds no {MANIFEST}: not a reflexdb archive") from None
    except ValueError as exc:
        raise ArchiveError(f"{directory / MANIFEST} is not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise ArchiveError(f"{directory / MANIFEST}: archive format {manifest.get('format')!r}, this reflexdb reads "
                           f"{FORMAT}")
    return manifest


def restore(store, directory: Path) -> ArchiveResult:
    """Insert an archived run back with its original ids, in one transaction.

    Raises:
        ArchiveError: no manifest, a file missing or changed since it was written (SHA-256), an
            archive of another schema revision, rows of an origin the database does not hold, or
            a run of that name or id already in the database (nothing is written).
    """
    import psycopg

    directory = Path(directory).expanduser()
    manifest = read_manifest(directory)
    name, run_id = manifest["run"], int(manifest["run_id"])
    with store.engine.connect() as conn:
        revision = migrate.current_revision(conn)
    if manifest.get("schema_revision") != revision:
        raise ArchiveError(f"the archive was written at schema revision {manifest.get('schema_revision')}, the "
                           f"database is at {revision}; restore into a database at that revision (reflexdb db "
                           "upgrade/downgrade)")
    for table, *_ in tables():
        entry = manifest["tables"].get(table)
        path = directory / f"{table}.parquet"
        if entry is None or not path.exists():
            raise ArchiveError(f"{path} is missing from the archive")
        if _sha256(path) != entry["sha256"]:
            raise ArchiveError(f"{path} changed since it was archived (SHA-256 differs)")
    missing = sorted(set(manifest.get("origins", ())) - set(store.origins(refresh=True)))
    if missing:
        raise ArchiveError(f"the archive's rows have origin(s) {', '.join(missing)}, which this database's table "
                           "origins does not hold; install the method that adds them (reflexdb db upgrade), then "
                           "restore")
    missing = sorted(set(manifest.get("group_kinds", ())) - set(store.group_kinds(refresh=True)))
    if missing:
        raise ArchiveError(f"the archive's groups have kind(s) {', '.join(missing)}, which this database's table "
                           "group_kinds does not hold; install the method that adds them (reflexdb db upgrade), then "
                           "restore")
    try:
        store.run_id(name)
    except NotFound:
        pass
    else:
        raise ArchiveError(f"a run named {name!r} exists; delete or rename it before restoring")
    from ..store import lock_run_creation

    rows: dict[str, int] = {}
    try:
        with store.transaction() as conn:
            lock_run_creation(conn)  # the run's row creates its partitions (store.lock_run_creation)
            for table, *_ in tables():
                rows[table] = _copy_back(conn, table, directory / f"{table}.parquet")
                if table == "runs":
                    conn.execute("SET LOCAL lock_timeout = DEFAULT")
    except psycopg.errors.LockNotAvailable:
        raise ArchiveError(f"cannot restore run {name!r} now: other transactions held the tables its partitions "
                           "refer to; nothing was written, run it again") from None
    except psycopg.errors.UniqueViolation as exc:
        raise ArchiveError(f"cannot restore run {name!r}: {exc.diag.message_primary} ({exc.diag.message_detail}); "
                           "nothing was written") from None
    return ArchiveResult(name, run_id, directory, rows, sum(p.stat().st_size for p in directory.iterdir()))


def _copy_back(conn, table: str, path: Path) -> int:
    """COPY the file's rows into ``table``, values converted to the column types."""
    import pyarrow.parquet as pq
    from psycopg.types.json import Jsonb

    columns = [c.name for c in schema.full_metadata().tables[table].columns]
    types = dict(conn.execute(
        "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped", (table,)).fetchall())
    names = [c for c in pq.ParquetFile(path).schema_arrow.names if c in types]
    if set(names) != set(columns):
        raise ArchiveError(f"{path}: columns {sorted(set(columns) ^ set(names))} differ from table {table}'s")
    kinds = [types[c] for c in names]
    convert = [_converter(k, Jsonb) for k in kinds]
    cur = conn.cursor()
    for kind in {k for k in kinds if k.endswith("[]")}:
        cur.adapters.register_dumper(None, _array_dumper(cur.adapters, cur.adapters.types.get_oid(kind)))
    n = 0
    with cur.copy(f"COPY {table} ({', '.join(names)}) FROM STDIN (FORMAT BINARY)") as cp:
        cp.set_types(kinds)
        for row in _rows_of_file(path):
            cp.write_row([None if row[c] is None else f(row[c]) for c, f in zip(names, convert)])
            n += 1
    return n


def _array_dumper(adapters, oid: int):
    """The binary COPY dumper of array type ``oid`` for restore: the connection's (reflexdb.codecs
    writes numpy arrays and lists, without NULL elements), and psycopg's own list dumper for a list
    that holds a NULL element (``consumption.advantages``: a value that was not finite)."""
    import psycopg
    from psycopg import adapt, pq

    fast_cls = adapters.get_dumper_by_oid(oid, pq.Format.BINARY)
    slow_cls = psycopg.adapters.get_dumper_by_oid(oid, pq.Format.BINARY)  # psycopg's defaults: no numpy

    class ArrayDumper(adapt.Dumper):
        format = pq.Format.BINARY

        def __init__(self, cls, context=None):
            super().__init__(cls, context)
            self._fast, self._slow = fast_cls(cls, context), slow_cls(cls, context)

        def dump(self, obj):
            return self._slow.dump(obj) if isinstance(obj, list) and None in obj else self._fast.dump(obj)

    ArrayDumper.oid = oid
    return ArrayDumper


def _converter(kind: str, jsonb) -> Callable[[Any], Any]:
    if kind == "jsonb":
        return lambda v: jsonb(json.loads(v) if isinstance(v, str) else v)
    if kind == "uuid":
        return lambda v: uuid.UUID(v)
    return lambda v: v


__all__ = ["CORE", "ArchiveError", "ArchiveResult", "archive", "read_manifest", "restore", "tables"]
