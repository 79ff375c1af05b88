"""A streaming read replica of the embedded server, and REFLEXDB_READ_URL for analysis commands."""

from __future__ import annotations

import json
import os
import subprocess
import time

import numpy as np
import pytest

from reflexdb import Store, embedded

from reflexdb.ops import replica
from reflexdb.db import make_engine
from tests.factories import make_group, setup_run
from tests.processes import REFLEXDB

pytestmark = pytest.mark.skipif(bool(os.environ.get("REFLEXDB_TEST_URL")),
                                reason="the replica is made of the embedded server")


@pytest.fixture
def primary(tmp_path):
    """An embedded server of the test's own, migrated, with a run; stopped afterwards with its replica."""
    home = tmp_path / "home"
    url = embedded.server_uri(home / "pgdata")
    store = Store.open(url, create_schema=True)
    try:
        yield home, url, store
    finally:
        store.close()
        replica.stop(home / "pgdata-replica")
        embedded.stop(home / "pgdata")


def _cli(args, home, **env):
    return subprocess.run(REFLEXDB + args, env=dict(os.environ, REFLEXDB_HOME=str(home), **env),
                          capture_output=True, text=True, timeout=180)


def _caught_up(primary_url, replica_url, timeout=30.0):
    deadline = time.monotonic() + timeout
    while replica.lag_bytes(primary_url, replica_url) > 0:
        assert time.monotonic() < deadline, "the replica did not catch up"
        time.sleep(0.1)


def test_analysis_reads_the_replica_and_writes_stay_on_the_primary(primary, tmp_path):
    home, url, store = primary
    run, (task, *_) = setup_run(store, "r")
    store.write_group(make_group(np.random.default_rng(0), run, task, size=4))
    out = _cli(["db", "replica"], home)
    assert out.returncode == 0, out.stderr
    read_url = out.stdout.strip().splitlines()[-1].split("=", 1)[1].strip("'")
    # the replica's socket sits in its data directory, or in a short directory of /tmp where that
    # path would pass a unix socket's 107 bytes (a deep pytest-xdist tmp_path)
    assert read_url.startswith("postgresql+psycopg://") and ("pgdata-replica" in read_url
                                                             or "/reflexdb-replica-" in read_url)

    store.write_group(make_group(np.random.default_rng(1), run, task, size=4))  # after the copy: streamed
    _caught_up(url, read_url)
    q = "SELECT count(*) AS n, pg_is_in_recovery() AS standby FROM trajectories"
    got = _cli(["sql", "--json", q], home, REFLEXDB_READ_URL=read_url)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == [{"n": 8, "standby": True}]
    assert json.loads(_cli(["sql", "--json", q], home).stdout) == [{"n": 8, "standby": False}]  # no variable: primary

    wrote = _cli(["sql", "--write", "UPDATE runs SET algorithm = 'grpo'"], home, REFLEXDB_READ_URL=read_url)
    assert wrote.returncode == 0, wrote.stderr  # --write goes to the primary, not the standby
    _caught_up(url, read_url)
    with make_engine(read_url).connect() as conn:
        assert conn.exec_driver_sql("SELECT algorithm FROM runs").scalar() == "grpo"

    exported = _cli(["export", "failures", "-o", str(tmp_path / "f.jsonl")], home, REFLEXDB_READ_URL=read_url)
    assert exported.returncode == 0, exported.stderr
    assert len((tmp_path / "f.jsonl").read_text().splitlines()) == 4  # make_group: half of each group fails

    assert _cli(["db", "replica", "--stop"], home).stdout.strip() == "replica stopped"
    again = _cli(["db", "replica"], home)  # starts again from its data directory, and catches up
    assert again.returncode == 0, again.stderr
    store.write_group(make_group(np.random.default_rng(2), run, task, size=4))
    _caught_up(url, read_url)
    assert json.loads(_cli(["sql", "--json", q], home, REFLEXDB_READ_URL=read_url).stdout)[0]["n"] == 12


def test_replica_refuses_when_the_database_is_not_the_embedded_one(tmp_path):
    out = _cli(["db", "replica"], tmp_path / "home", REFLEXDB_DATABASE_URL="postgresql://127.0.0.1:1/elsewhere")
    assert out.returncode == 1 and "copies the embedded server" in out.stderr
    assert not (tmp_path / "home" / "pgdata").exists()  # nothing started
