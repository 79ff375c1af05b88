"""Least-privilege PostgreSQL roles for collectors, the learner and people with psql.

``reflexdb db roles`` creates three group roles and grants them what their processes need on the
current database (``reflexdb/sql/roles.sql`` says exactly what, and what not):

=====================  ==========================================================================
``reflexdb_collector`` claim tasks and replay requests, write groups, read policy versions and
                       settings; no DELETE, no UPDATE of trained data, no ``runs.config``, no
                       learner tables
``reflexdb_learner``   read all; record steps, publish versions, set settings, post replay requests
``reflexdb_reader``    read only
=====================  ==========================================================================

``reflexdb db user NAME --role collector`` adds a login role in one of them. Its password is
hashed on the client (SCRAM-SHA-256, libpq's ``PQencryptPasswordConn``), so the clear text never
reaches the server, its logs or this process's output.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from .errors import ReflexdbError
from .sqlfile import folders, load_queries, parse_queries

ROLES = {"collector": "reflexdb_collector", "learner": "reflexdb_learner", "reader": "reflexdb_reader"}
_BLOCKS = ("create_roles", "reset", "reader", "collector", "learner")


def apply(engine: Engine) -> None:
    """Create the roles if needed and (re)grant their privileges on this database, in one transaction.

    Raises:
        ReflexdbError: this login may not create roles or grant on the tables (nothing changed).
    """
    import psycopg

    sql = load_queries("roles.sql")
    blocks = [sql[block] for block in _BLOCKS] + method_grants()
    try:
        with engine.begin() as conn:
            raw = conn.connection.driver_connection
            for block in blocks:
                raw.execute(block)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ReflexdbError(f"cannot create or grant the reflexdb roles: {exc.diag.message_primary}. Run "
                            "`reflexdb db roles` as the database owner with CREATEROLE, or as a superuser; "
                            "nothing was changed") from None


def method_grants() -> list[str]:
    """The block ``grants`` of each installed package's ``sql/roles.sql`` (its tables and views), in
    registration order; a package without one grants nothing beyond what the learner and the reader
    read already."""
    out = []
    for owner, folder in folders()[1:]:
        path = folder / "roles.sql"
        if path.is_file():
            blocks = parse_queries(path.read_text())
            if "grants" not in blocks:
                raise ReflexdbError(f"{path} ({owner}'s roles) has no block '-- name: grants'")
            out.append(blocks["grants"])
    return out


def exist(engine: Engine) -> bool:
    """Whether ``reflexdb db roles`` was run on this server (then ``db upgrade`` re-grants)."""
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        return raw.execute("SELECT count(*) FROM pg_roles WHERE rolname = ANY(%s)",
                           (list(ROLES.values()),)).fetchone()[0] == len(ROLES)


def create_user(engine: Engine, name: str, role: str, password: str | None) -> None:
    """A login role ``name`` in ``reflexdb_<role>`` (created, or its password and membership set).

    Raises:
        ReflexdbError: ``role`` is not collector, learner or reader, the roles do not exist yet, or
            this login may not create roles.
    """
    import psycopg

    if role not in ROLES:
        raise ReflexdbError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}")
    if not exist(engine):
        raise ReflexdbError("the reflexdb roles do not exist on this server yet: run `reflexdb db roles` first")
    try:
        _create_user(engine, name, role, password)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ReflexdbError(f"cannot create login role {name!r}: {exc.diag.message_primary}. Run `reflexdb db user` "
                            "as a role with CREATEROLE, or as a superuser; nothing was changed") from None


def _create_user(engine: Engine, name: str, role: str, password: str | None) -> None:
    from psycopg import sql as psql

    with engine.begin() as conn:
        raw = conn.connection.driver_connection
        hashed = None
        if password:
            hashed = raw.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256").decode()
        found = raw.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
        verb = "ALTER" if found else "CREATE"
        stmt = psql.SQL("{} ROLE {} LOGIN").format(psql.SQL(verb), psql.Identifier(name))
        if hashed:
            stmt = psql.SQL("{} PASSWORD {}").format(stmt, psql.Literal(hashed))
        raw.execute(stmt)
        raw.execute(psql.SQL("GRANT {} TO {}").format(psql.Identifier(ROLES[role]), psql.Identifier(name)))
