"""CLI habits: --version, shell completion, `run -c/--url`, `sql -v name=value`, `sql --json/--csv`."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import numpy as np

from tests.factories import make_group, setup_run

REFLEXDB = [sys.executable, "-m", "reflexdb.cli.main"]


def _cli(args, url=None, home=None, **kw):
    env = dict(os.environ)
    if url:
        env["REFLEXDB_DATABASE_URL"] = url
    if home:
        env["REFLEXDB_HOME"] = str(home)
    return subprocess.run(REFLEXDB + args, env=env, capture_output=True, text=True, timeout=120, **kw)


def test_version():
    from reflexdb import __version__

    out = _cli(["--version"])
    assert out.returncode == 0 and out.stdout.strip() == f"reflexdb {__version__}"


def test_shell_completion_script():
    out = _cli(["--show-completion", "bash"])
    assert out.returncode == 0, out.stderr
    assert "complete" in out.stdout and "_COMPLETE" in out.stdout


def test_run_takes_c_like_the_other_commands(tmp_path):
    missing = tmp_path / "nope.yaml"
    out = _cli(["run", "-c", str(missing)], home=tmp_path)
    assert out.returncode == 2 and f"config file {missing} does not exist" in out.stderr
    out = _cli(["run"], home=tmp_path)
    assert out.returncode == 2 and "give the run config: `reflexdb run CONFIG` or `reflexdb run -c CONFIG`" in out.stderr
    out = _cli(["run", "a.yaml", "-c", "b.yaml"], home=tmp_path)
    assert out.returncode == 2 and "two configs given" in out.stderr
    out = _cli(["run", "--help"])
    assert "--url" in out.stdout and "--config" in out.stdout


def test_sql_variables_json_and_csv(store, db_url, tmp_path):
    run, tasks = setup_run(store, "o'brien")
    store.write_group(make_group(np.random.default_rng(0), run, tasks[0], size=4, n_correct=1))
    query = ("SELECT r.name, count(*) AS n, avg(t.reward) AS mean, array_agg(t.reward ORDER BY t.id) AS rewards "
             "FROM trajectories t JOIN runs r ON r.id = t.run_id WHERE r.name = :'run' AND t.reward >= :floor::int "
             "GROUP BY r.name")
    table = _cli(["sql", "-v", "run=o'brien", "-v", "floor=0", query], db_url, tmp_path)
    assert table.returncode == 0, table.stderr
    assert "o'brien" in table.stdout and table.stdout.rstrip().endswith("(1 row)")
    as_json = _cli(["sql", "--json", "-v", "run=o'brien", "-v", "floor=0", query], db_url, tmp_path)
    assert json.loads(as_json.stdout) == [{"name": "o'brien", "n": 4, "mean": 0.25, "rewards": [1.0, 0.0, 0.0, 0.0]}]
    as_csv = _cli(["sql", "--csv", "-v", "run=o'brien", "-v", "floor=0", query], db_url, tmp_path)
    assert list(csv.reader(io.StringIO(as_csv.stdout))) == [["name", "n", "mean", "rewards"],
                                                            ["o'brien", "4", "0.25", "[1.0, 0.0, 0.0, 0.0]"]]
    unset = _cli(["sql", query], db_url, tmp_path)
    assert unset.returncode == 1 and "uses :floor, :run, which is not set: pass -v floor=VALUE -v run=VALUE" in unset.stderr
    bad = _cli(["sql", "-v", "run", query], db_url, tmp_path)
    assert bad.returncode == 1 and "-v 'run': expected NAME=VALUE" in bad.stderr
