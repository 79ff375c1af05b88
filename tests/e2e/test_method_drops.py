"""A method whose batch rule drops groups, at ``max_staleness: 1`` (issue 60, item 2).

The sevenths plug-in (tests/data/plugins/sevenths, built as docs/tutorial-method.md builds a
method) never trains every seventh group and says so in ``Method.drops``: its view
``sevenths_group_holds``. Installed as pip installs a package, it runs 50 learner steps with the
tiny model, a version per step, collector and learner as processes (``reflexdb run``). Before
``Method.drops``, admission control counted the dropped groups: the collector waited for a version
("would be 2 versions stale") that the learner, waiting for groups, could not train; both stood
still at step 9 of 50 with this config. This test process never loads the plug-in: only the
processes it starts see it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.processes import REFLEXDB, child_env, rows

PLUGIN = Path(__file__).resolve().parents[1] / "data" / "plugins" / "sevenths"


def install(site: Path) -> str:
    """What ``pip install -e tests/data/plugins/sevenths`` leaves for Python: the package's metadata
    with its entry point, and its source folder on the path. Returns the PYTHONPATH."""
    info = site / "reflexdb_sevenths-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reflexdb-sevenths\nVersion: 0.1.0\n")
    declared = '[project.entry-points."reflexdb.plugins"]\nsevenths = "reflexdb_sevenths:plugin"\n'
    assert declared in (PLUGIN / "pyproject.toml").read_text()
    (info / "entry_points.txt").write_text("[reflexdb.plugins]\nsevenths = reflexdb_sevenths:plugin\n")
    return f"{site}:{PLUGIN / 'src'}"


def test_fifty_steps_at_max_staleness_1_with_a_method_that_drops_every_seventh_group(store, db_url, tmp_path,
                                                                                   model_cache):
    env = child_env(db_url, tmp_path, model_cache)
    env["PYTHONPATH"] = install(tmp_path / "site")
    up = subprocess.run(REFLEXDB + ["db", "upgrade"], env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]

    # --max-seconds bounds the run: two processes waiting on each other end it with fewer steps
    run = subprocess.run(REFLEXDB + ["run", str(PLUGIN / "sevenths.yaml"), "--max-steps", "50", "--max-seconds", "400",
                                     "--no-eval"], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    assert rows(store, "SELECT count(*), max(step), max(policy_version) FROM learner_steps") == [(50, 50, 49)], \
        run.stderr[-4000:]
    assert "admission control leaves out the groups in sevenths_group_holds" in run.stderr

    # every seventh group was dropped, none trained; every other one trained within the bound
    dropped = rows(store, "SELECT count(*) FROM groups WHERE id % 7 = 0")[0][0]
    assert dropped >= 14
    assert rows(store, "SELECT count(*) FROM consumption c JOIN groups g ON g.id = c.group_id "
                       "WHERE g.id % 7 = 0") == [(0,)]
    assert rows(store, "SELECT max(staleness) FROM staleness") == [(1,)]
    # what was not trained has its reason: the method's for the dropped ones, and the last few wait
    untrained = dict(rows(store, "SELECT reason, count(*) FROM untrained_groups GROUP BY 1"))
    assert untrained.pop("seventh") == dropped, untrained
    assert set(untrained) <= {"waiting"}, untrained
