"""`reflexdb similar` as a command."""

from __future__ import annotations

import os
import subprocess

import numpy as np

from reflexdb import NotFound
from tests.factories import make_group, setup_run
from tests.processes import REFLEXDB


def test_cli_similar_unknown_trajectory_is_a_clean_error(store, db_url, reflexdb_home):
    rng = np.random.default_rng(11)
    run, tasks = setup_run(store)
    [plain] = [store.write_group(make_group(rng, run, tasks[0], size=1, dim=None)).trajectory_ids]
    env = {**os.environ, "REFLEXDB_DATABASE_URL": db_url, "REFLEXDB_HOME": str(reflexdb_home)}
    env.pop("REFLEXDB_DEBUG", None)
    for tid, message in ((987654, "error: no trajectory with id 987654"), (plain[0], "has no embedding")):
        proc = subprocess.run([*REFLEXDB, "similar", str(tid)], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == NotFound.exit_code, proc.stderr
        assert message in proc.stderr
        assert "Traceback" not in proc.stderr
