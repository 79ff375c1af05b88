"""Bad input to the CLI as a user meets it: one line, the right exit code (child processes)."""

from __future__ import annotations

import subprocess

from tests.store.test_bad_input import REFLEXDB  # noqa: F401


def test_cli_schema_outdated_message(empty_db_url, tmp_path):
    env = {"REFLEXDB_DATABASE_URL": empty_db_url, "REFLEXDB_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(REFLEXDB + ["db", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "run `reflexdb db upgrade`" in proc.stdout


def test_unreachable_server_cli_message(tmp_path):
    env = {"REFLEXDB_DATABASE_URL": "postgresql://alice:s3cret@127.0.0.1:1/nowhere", "REFLEXDB_HOME": str(tmp_path),
           "PATH": "/usr/bin:/bin"}
    for args in (["db", "status"], ["db", "upgrade"], ["sql", "SELECT 1"]):
        proc = subprocess.run(REFLEXDB + args, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3, (args, proc.stderr)
        assert "cannot connect to PostgreSQL at postgresql://alice:***@127.0.0.1:1/nowhere" in proc.stderr
        assert "s3cret" not in proc.stderr + proc.stdout
        assert "Traceback" not in proc.stderr


def test_wrong_url_scheme(tmp_path):
    env = {"REFLEXDB_DATABASE_URL": "mysql://root@localhost/x", "REFLEXDB_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(REFLEXDB + ["db", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "reflexdb needs PostgreSQL" in proc.stderr and "Traceback" not in proc.stderr
