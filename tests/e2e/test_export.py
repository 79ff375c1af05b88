"""`reflexdb export` as a command."""

from __future__ import annotations

import subprocess

from tests.processes import REFLEXDB
from tests.store.test_export import _fill  # noqa: F401


def test_the_export_command(store, db_url, tmp_path):
    _fill(store)
    out = tmp_path / "f.jsonl"
    done = subprocess.run(REFLEXDB + ["export", "failures", "--out", str(out), "--url", db_url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote 9 rows" in done.stdout and len(out.read_text().splitlines()) == 9
    bad = subprocess.run(REFLEXDB + ["export", "failures", "--out", str(tmp_path / "f.xlsx"), "--url", db_url],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "use .parquet, .jsonl or .csv" in bad.stderr
