"""Passwords never shown, as the commands print errors (child processes)."""

from __future__ import annotations

import os
import subprocess

import pytest
from sqlalchemy.engine import make_url

from reflexdb import Store
from reflexdb.settings import normalize_url
from tests.unit.test_secrets import FORMS, REFLEXDB, SECRET  # noqa: F401


def test_a_dsn_connects_like_its_url(store, db_url, tmp_path):
    """A key/value DSN is accepted where a URL is: the same database, its password masked in `db status`
    (trust authentication ignores the password)."""
    u = make_url(db_url)
    parts = {"host": u.host or u.query.get("host"), "port": u.port or u.query.get("port"), "dbname": u.database,
             "user": u.username, "password": "hunter2 x"}
    dsn = " ".join(f"{k}='{v}'" for k, v in parts.items() if v)
    url = normalize_url(dsn)
    assert make_url(url).query["password"] == "hunter2 x"
    with Store.open(dsn) as other:
        assert other.table_counts() == store.table_counts()
    for given in (dsn, url):
        env = dict(os.environ, REFLEXDB_DATABASE_URL=given, REFLEXDB_HOME=str(tmp_path))
        proc = subprocess.run(REFLEXDB + ["db", "status"], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "hunter2" not in proc.stdout + proc.stderr and "password=***" in proc.stdout


@pytest.mark.parametrize("form", ["query", "dsn", "dsn, quoted with a space"])
def test_cli_connection_error_hides_the_password(form, tmp_path):
    env = {"REFLEXDB_DATABASE_URL": FORMS[form], "REFLEXDB_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(REFLEXDB + ["db", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "cannot connect to PostgreSQL at" in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
