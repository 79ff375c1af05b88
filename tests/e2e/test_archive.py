"""`reflexdb db archive` / `db restore` as commands (child processes)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.store.test_archive import _a_run  # noqa: F401


def test_cli_archive_and_restore(store, db_url, tmp_path):
    _a_run(store)
    env = dict(os.environ, REFLEXDB_DATABASE_URL=db_url, REFLEXDB_HOME=str(tmp_path / "home"))
    cli = [sys.executable, "-m", "reflexdb.cli.main", "db"]
    out = subprocess.run(cli + ["archive", "busy", "-o", str(tmp_path / "a")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "verified, and deleted" in out.stdout
    out = subprocess.run(cli + ["restore", str(tmp_path / "a")], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("restored run 'busy'")
    out = subprocess.run(cli + ["restore", str(tmp_path / "a")], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "a run named 'busy' exists" in out.stderr
