"""The CLI as a user runs it: `reflexdb db`, `sql`, `psql` (subprocesses on a real database)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from reflexdb import migrate
from tests.factories import make_group, setup_run

REFLEXDB = [sys.executable, "-m", "reflexdb.cli.main"]


def run_cli(args, url, tmp_path, check=True):
    env = dict(os.environ, REFLEXDB_DATABASE_URL=url, REFLEXDB_HOME=str(tmp_path))
    proc = subprocess.run(REFLEXDB + args, env=env, capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_console_script_is_installed():
    assert shutil.which("reflexdb") or os.path.exists(os.path.join(os.path.dirname(sys.executable), "reflexdb"))


def test_db_upgrade_and_status(empty_db_url, tmp_path):
    head = migrate.head_revision()
    out = run_cli(["db", "upgrade"], empty_db_url, tmp_path).stdout
    assert f"schema upgraded (empty) -> {head}" in out
    assert f"schema already at {head}" in run_cli(["db", "upgrade"], empty_db_url, tmp_path).stdout
    status = run_cli(["db", "status"], empty_db_url, tmp_path).stdout
    assert f"schema revision: {head} (up to date)" in status
    assert "trajectories" in status and "data size:" in status


def test_db_status_masks_password(store, db_url, tmp_path):
    # Same server, same database, with a password in the URL: trust auth ignores it.
    import getpass

    from sqlalchemy.engine import make_url

    u = make_url(db_url)
    # libpq's default user is the OS user; name it so the URL carries user:password@.
    url = u.set(username=u.username or getpass.getuser(), password="hunter2").render_as_string(hide_password=False)
    proc = run_cli(["db", "status"], url, tmp_path)
    assert "hunter2" not in proc.stdout and ":***@" in proc.stdout


def test_db_downgrade_needs_yes(db_url, tmp_path):
    proc = run_cli(["db", "downgrade", "base"], db_url, tmp_path, check=False)
    assert proc.returncode != 0  # no confirmation on a closed stdin
    out = run_cli(["db", "downgrade", "base", "--yes"], db_url, tmp_path).stdout
    assert f"{migrate.head_revision()} -> (empty)" in out


def test_sql_prints_table_and_is_read_only(store, db_url, tmp_path):
    run, tasks = setup_run(store)
    store.write_group(make_group(np.random.default_rng(0), run, tasks[0], size=4, n_correct=1))
    out = run_cli(["sql", "SELECT class, n_correct, pass_rate FROM group_stats"], db_url, tmp_path).stdout
    lines = out.splitlines()
    assert lines[0].split("|")[0].strip() == "class"
    assert "some-pass" in lines[2] and "0.25" in lines[2]
    assert lines[-1] == "(1 row)"
    proc = run_cli(["sql", "DELETE FROM trajectories"], db_url, tmp_path, check=False)
    assert proc.returncode != 0 and "--write" in proc.stderr and "Traceback" not in proc.stderr
    assert store.table_counts()["trajectories"] == 4
    out = run_cli(["sql", "--write", "DELETE FROM turns"], db_url, tmp_path).stdout
    assert "DELETE 8" in out
    assert store.table_counts()["turns"] == 0


def test_sql_error_is_one_line(db_url, tmp_path):
    proc = run_cli(["sql", "SELECT * FROM no_such_table"], db_url, tmp_path, check=False)
    assert proc.returncode == 1
    assert 'relation "no_such_table" does not exist' in proc.stderr and "Traceback" not in proc.stderr


def test_psql_runs_on_the_database(store, db_url, tmp_path):
    setup_run(store, "psql-run")
    proc = run_cli(["psql", "--", "-At", "-c", "SELECT name FROM runs"], db_url, tmp_path)
    assert proc.stdout.strip() == "psql-run"


def test_db_url_feeds_libpq_tools(store, db_url, tmp_path):
    setup_run(store, "dumped-run")
    url = run_cli(["db", "url"], db_url, tmp_path).stdout.strip()
    assert url.startswith("postgresql://")
    bindir = run_cli(["db", "url", "--bin-dir"], db_url, tmp_path).stdout.strip()
    dump = subprocess.run([os.path.join(bindir, "pg_dump"), "--data-only", "-t", "runs", url],
                          capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr
    assert "dumped-run" in dump.stdout


@pytest.mark.parametrize("collectors", [1, 3])
def test_run_gives_the_learner_every_core_and_threads_that_sleep(monkeypatch, tmp_path, collectors):
    """`reflexdb run`: the learner gets every core, each collector cores // n (at least 1), and
    OpenMP threads wait PASSIVE, so a process that waits leaves its cores to the one that works;
    what the user set wins."""
    from pathlib import Path

    from reflexdb.cli import launch

    started: list[tuple[list[str], dict]] = []

    class Proc:
        def wait(self, timeout=None):
            return 0

        def poll(self):
            return 0

    def popen(cmd, env, **kw):
        started.append((cmd, env))
        return Proc()

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 8)
    for var in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(var, raising=False)
    config = Path(__file__).parents[2] / "examples" / "arithmetic-grpo.yaml"
    launcher = launch.Launcher(config, max_steps=1, max_seconds=None, collectors=collectors, overrides=None,
                               evaluate=False, echo=lambda m: None)
    launcher.url = "postgresql://unused"
    assert launcher._train() == 0
    threads = {cmd[cmd.index("-m") + 2]: (env["OMP_NUM_THREADS"], env["OMP_WAIT_POLICY"]) for cmd, env in started}
    assert threads == {"collect": (str(max(1, 8 // collectors)), "PASSIVE"), "learn": ("8", "PASSIVE")}
    started.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    launcher._train()
    assert {(env["OMP_NUM_THREADS"], env["OMP_WAIT_POLICY"]) for _, env in started} == {("3", "ACTIVE")}
