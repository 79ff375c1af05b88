"""What the ``reflexdb db`` and ``sql`` commands do with the database, as plain functions.

Printing their results and starting ``psql`` belong to the command line (:mod:`reflexdb.cli.screen`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from .. import embedded, migrate, roles, schema
from .. import runs as run_table
from ..db import database_url, libpq_url, make_engine
from ..errors import ReflexdbError
from ..settings import mask_url, resolve_target


def _engine(url: str | None):
    return make_engine(database_url(resolve_target(url)))


def upgrade(url: str | None, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate to ``revision``; return (revision before, revision after).

    When the least-privilege roles exist (``reflexdb db roles``), their grants are made again, so
    tables a migration added are covered.
    """
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            before = migrate.current_revision(conn)
        migrate.upgrade(engine, revision)
        with engine.connect() as conn:
            after = migrate.current_revision(conn)
        if after != before and roles.exist(engine):
            roles.apply(engine)
        return before, after
    finally:
        engine.dispose()


def apply_roles(url: str | None) -> str:
    """Create the least-privilege roles and grant them on the database; return its name (masked URL)."""
    engine = _engine(url)
    try:
        migrate.check_current(engine)  # grants name every table: the schema must be complete
        roles.apply(engine)
        return mask_url(engine.url.render_as_string(hide_password=False))
    finally:
        engine.dispose()


def create_user(url: str | None, name: str, role: str, password: str | None) -> str:
    """A login role in one of the reflexdb roles; return a URL to give its user (password masked)."""
    engine = _engine(url)
    try:
        roles.create_user(engine, name, role, password)
        u = engine.url.set(username=name, password="placeholder" if password else None)
        return mask_url(u.render_as_string(hide_password=False))  # the password shown as ***
    finally:
        engine.dispose()


def downgrade(url: str | None, revision: str) -> tuple[str | None, str | None]:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            before = migrate.current_revision(conn)
        migrate.downgrade(engine, revision)
        with engine.connect() as conn:
            return before, migrate.current_revision(conn)
    finally:
        engine.dispose()


@dataclass
class Status:
    fields: dict[str, str]
    counts: dict[str, int] = field(default_factory=dict)
    runs: list[tuple[str, int, int, int]] = field(default_factory=list)  # name, id, bytes, trajectories


def status(url: str | None) -> Status:
    """URL (masked), server, schema revision against the code's head (and what to do about revisions
    no installed package provides), row counts of every table, data size."""
    target = resolve_target(url)
    engine = make_engine(database_url(target))
    try:
        with engine.connect() as conn:
            current = migrate.current_revision(conn)
            version = conn.execute(text("SHOW server_version")).scalar()
            size = conn.execute(text("SELECT pg_size_pretty(pg_database_size(current_database()))")).scalar()
            unknown = migrate.unknown_revisions(conn)
            # every table: the declared ones (reflexdb's and each installed package's, schema.full_metadata)
            # in dependency order, then any other (a package's that declares none, or one no longer installed)
            existing = set(conn.execute(text(
                "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
                "AND relkind IN ('r', 'p') AND NOT relispartition AND relname <> 'alembic_version'")).scalars())
            declared = [t.name for t in schema.full_metadata().sorted_tables]
            names = [n for n in declared if n in existing] + sorted(existing - set(declared))
            counts = {}
            if names:
                quote = conn.dialect.identifier_preparer.quote
                sql = " UNION ALL ".join(f"SELECT {i}, count(*) FROM {quote(n)}" for i, n in enumerate(names))
                counts = {names[i]: n for i, n in conn.execute(text(sql)).all()}
            runs = []
            if conn.execute(text("SELECT to_regproc('run_partitions_size')")).scalar() is not None:  # >= 0015
                runs = run_table.sizes(conn)
    finally:
        engine.dispose()
    head = migrate.head_revision()
    if current == head:
        rev = f"{current} (up to date)"
    elif current is None:
        rev = f"none: run `reflexdb db upgrade` (code is at {head})"
    elif unknown:  # Alembic cannot upgrade such a database: what to do instead is the next field
        rev = f"{current} (code is at {head})"
    else:
        rev = f"{current}: run `reflexdb db upgrade` (code is at {head})"
    fields = {
        "database": mask_url(engine.url.render_as_string(hide_password=False)),
        "server": f"PostgreSQL {version}" + (" (embedded)" if target.embedded else ""),
    }
    if target.embedded:
        fields["data directory"] = str(target.pgdata)
    fields["schema revision"] = rev
    if unknown:
        fields["unknown revision"] = migrate.explain_unknown(unknown)
    fields["data size"] = size
    return Status(fields, counts, runs)


def stop_embedded() -> bool:
    return embedded.stop(resolve_target().pgdata)


@dataclass
class SqlResult:
    columns: list[str]
    rows: list[tuple]
    status: str


def run_sql(url: str | None, query: str, *, write: bool = False) -> SqlResult:
    """Run ``query`` in one transaction (read-only unless ``write``) and fetch every row."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            raw = conn.connection.driver_connection
            try:
                with raw.transaction():
                    if not write:
                        raw.execute("SET TRANSACTION READ ONLY")
                    cur = raw.execute(query)
                    columns = [d.name for d in cur.description] if cur.description else []
                    rows = cur.fetchall() if cur.description else []
                    status = "" if cur.description else (cur.statusmessage or "")
            except DBAPIError as exc:  # pragma: no cover - raw psycopg raises its own errors
                raise ReflexdbError(str(exc.orig)) from None
            except Exception as exc:
                import psycopg

                if not isinstance(exc, psycopg.Error):
                    raise
                msg = (exc.diag.message_primary if getattr(exc, "diag", None) else None) or str(exc)
                hint = ""
                if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
                    hint = " (the transaction is read-only: pass --write to change data)"
                raise ReflexdbError(f"SQL error: {msg}{hint}") from None
    finally:
        engine.dispose()
    return SqlResult(columns, rows, status)


def libpq_url_for(url: str | None) -> str:
    """The configured database's URL for libpq tools, checked to be reachable."""
    full = database_url(resolve_target(url))
    make_engine(full).dispose()
    return libpq_url(full)


def bin_dir() -> str:
    return str(embedded.psql_path().parent)


def run_processes(store, name: str) -> list[str]:
    """The processes of run ``name`` that make it "in use" (``reflexdb runs delete`` and ``reflexdb
    db archive`` refuse then): connected sessions of its collect, learn, eval or import, and
    collectors with a recent heartbeat, each as ``who (pid P on host)``."""
    live = run_table.processes(store, name)
    return [f"{w} (pid {pid}{f' on {h}' if h else ''})" for _, w, h, pid in live]
