"""A ``reflexdb/`` folder where the user stands shadows nothing (issue 60).

``reflexdb ui`` and ``reflexdb run`` started their children with ``python -m``, which puts the
working directory first on the module path: beside a clone of the project (or any stale
``reflexdb/`` folder) the explorer failed with ``FileNotFoundError: reflexdb/sql/explorer.sql``
and the collector and learner with "cannot import name 'Store' from 'reflexdb'". The children now
start with the working directory off their path (``cli/children.py``: ``-P``, or before Python 3.11
a ``-c`` bootstrap). Checked from a folder whose ``reflexdb/__init__.py`` raises: here the command
lines ``reflexdb run`` starts its children with (both forms); ``reflexdb ui``, its explorer serving a
page, in ``tests/e2e/test_ui.py`` (its SIGINT case starts there).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reflexdb.cli import launch
from reflexdb.cli.children import python_module

STALE = "raise ImportError('the stale reflexdb folder in the working directory was imported')\n"


def beside_a_stale_clone(tmp_path: Path) -> Path:
    """A working directory holding a ``reflexdb/`` package that cannot be imported (and no ``sql/``)."""
    here = tmp_path / "here"
    (here / "reflexdb").mkdir(parents=True)
    (here / "reflexdb" / "__init__.py").write_text(STALE)
    return here


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    return dict(env, REFLEXDB_HOME=str(tmp_path / "home"), **extra)


def test_the_children_reflexdb_run_starts_are_not_shadowed(tmp_path):
    here = beside_a_stale_clone(tmp_path)
    env = _env(tmp_path)
    # the folder does shadow a plain `python -m` (the command line `reflexdb run` used)
    plain = subprocess.run([sys.executable, "-m", "reflexdb.cli.main", "plugins"], cwd=here, env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0 and "the stale reflexdb folder in the working directory" in plain.stderr
    # the command line of reflexdb run's children, and the form for Python 3.10 (no -P there)
    assert launch.CLI == python_module("reflexdb.cli.main")
    for cmd in (launch.CLI, python_module("reflexdb.cli.main", safe_path_flag=False)):
        child = subprocess.run(cmd + ["plugins"], cwd=here, env=env, capture_output=True, text=True, timeout=120)
        assert child.returncode == 0, (cmd[:3], child.stderr[-3000:])
        assert any(line.startswith("lte ") for line in child.stdout.splitlines()), child.stdout
