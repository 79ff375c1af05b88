"""Engines and connections: embedded or external PostgreSQL, with clear errors.

Every connection gets the numpy array adapters (:mod:`reflexdb.codecs`). Failures to connect are
turned into :class:`~reflexdb.errors.DatabaseUnavailable` naming the URL with its password masked.
"""

from __future__ import annotations

import os

import psycopg
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError, ProgrammingError

from . import codecs, embedded
from .errors import DatabaseUnavailable
from .settings import DatabaseTarget, mask_url, normalize_url, resolve_target, scrub

CONNECT_TIMEOUT_S = 10
#: the session name (pg_stat_activity.application_name) of this process's connections
ENV_APPLICATION_NAME = "REFLEXDB_APPLICATION_NAME"


def name_process(role: str, run: str) -> None:
    """Name this process's database sessions ``reflexdb <role> <run>`` (``reflexdb runs`` finds a run's
    live processes by it; PostgreSQL keeps 63 bytes of it)."""
    os.environ[ENV_APPLICATION_NAME] = f"reflexdb {role} {run}"


def application_name() -> str:
    return os.environ.get(ENV_APPLICATION_NAME) or "reflexdb"


def database_url(target: DatabaseTarget | None = None) -> str:
    """The SQLAlchemy URL to use, starting the embedded server if that is the target."""
    target = target or resolve_target()
    return target.url if target.url else embedded.server_uri(target.pgdata)


def libpq_url(url: str) -> str:
    """The same URL in the form psql and plain psycopg accept (no ``+psycopg`` driver tag)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def make_engine(url: str | None = None, *, pool_size: int = 5) -> Engine:
    """Create an engine for ``url`` (default: the configured target) and check it connects.

    ``postgres://`` and ``postgresql://`` URLs are given the psycopg 3 driver.
    """
    url = normalize_url(url) if url else database_url()
    engine = create_engine(
        url,
        pool_size=pool_size,
        pool_pre_ping=True,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "application_name": application_name()},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised via every test
        codecs.register(dbapi_conn)

    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (OperationalError, ProgrammingError) as exc:  # unreachable, refused; or an option libpq rejects
        engine.dispose()
        raise DatabaseUnavailable(_describe(url, exc.orig)) from None
    return engine


def connect_raw(url: str, **kwargs) -> psycopg.Connection:
    """A plain psycopg connection (LISTEN, bulk COPY) with the numpy adapters installed."""
    try:
        kwargs.setdefault("application_name", application_name())
        conn = psycopg.connect(libpq_url(url), connect_timeout=CONNECT_TIMEOUT_S, **kwargs)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        raise DatabaseUnavailable(_describe(url, exc)) from None
    codecs.register(conn)
    return conn


def _describe(url: str, exc: BaseException | None) -> str:
    reason = scrub(str(exc).strip().splitlines()[0], url) if exc else "unknown error"
    return (
        f"cannot connect to PostgreSQL at {mask_url(url)}: {reason}\n"
        "Check that the server is running and the URL (REFLEXDB_DATABASE_URL or database_url in "
        "$REFLEXDB_HOME/config.toml) is right; unset it to use the embedded server."
    )
