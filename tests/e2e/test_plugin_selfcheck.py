"""A sixth method from outside the tree (issue 35): the selfcheck plug-in in examples/plugins/selfcheck,
installed as pip installs a package (its dist-info with the ``reflexdb.plugins`` entry point, its
source on the path), adds its origin, table and view to a database made before it was installed
(``reflexdb db upgrade``), and runs end to end with ``reflexdb run``: its workflow writes answers and
verifications in one transaction, its attachment writes the verdicts, its loss terms and metrics
reach the learner's steps, and its rows answer in SQL. This test process never loads the plug-in:
only the processes it starts see it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.processes import REFLEXDB, child_env, rows

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "selfcheck"


def install(site: Path) -> str:
    """What ``pip install -e examples/plugins/selfcheck`` leaves for Python: the package's metadata
    with its entry point, and its source folder on the path. Returns the PYTHONPATH."""
    info = site / "reflexdb_selfcheck-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reflexdb-selfcheck\nVersion: 0.1.0\n")
    declared = '[project.entry-points."reflexdb.plugins"]\nselfcheck = "reflexdb_selfcheck"\n'
    assert declared in (PLUGIN / "pyproject.toml").read_text()
    (info / "entry_points.txt").write_text("[reflexdb.plugins]\nselfcheck = reflexdb_selfcheck\n")
    return f"{site}:{PLUGIN / 'src'}"


def test_the_selfcheck_plugin_upgrades_a_database_and_runs_end_to_end(store, db_url, tmp_path, model_cache):
    # made before the plug-in: the heads of the built-in branches (Alembic keeps the heads no other
    # implies: reflexdb's 0026 is newer than the 0024 LTE's lte_0003 depends on, below lte_0004)
    assert sorted(rows(store, "SELECT version_num FROM alembic_version")) == [("0029",), ("lte_0004",), ("r3l_0002",)]
    env = child_env(db_url, tmp_path, model_cache)
    env["PYTHONPATH"] = install(tmp_path / "site")

    up = subprocess.run(REFLEXDB + ["db", "upgrade"], env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    assert rows(store, "SELECT pi_old, pass_at_1, sampled, method FROM origins WHERE name = 'verification'") == [
        ("policy", False, True, "selfcheck")]
    assert sorted(rows(store, "SELECT version_num FROM alembic_version")) == [
        ("0029",), ("lte_0004",), ("r3l_0002",), ("selfcheck_0001",)]

    run = subprocess.run(REFLEXDB + [
        "run", str(PLUGIN / "selfcheck.yaml"), "--max-steps", "2", "--no-eval",
        *[a for s in ("run=selfcheck-e2e", "model=tiny", "collector.group_size=4", "collector.tasks_per_batch=2",
                      "collector.sampling.max_new_tokens=8", "learner.groups_per_step=4", "learner.micro_batch_size=4",
                      "learner.keep_states=1", "learner.keep_policies=2", "tasks.eval_size=2",
                      "learner.eval_samples=2", "selfcheck.max_tokens=4", "selfcheck.verify_weight=0.5")
          for a in ("--set", s)]], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "run 'selfcheck-e2e': 2 learner steps" in run.stdout, run.stdout

    # its rows in SQL: every verification points at an answer of its task and has its verdict row
    checks = rows(store, """
        SELECT v.origin, a.origin, v.task_id = a.task_id, s.answer_correct = a.correct,
               s.agrees = (s.verdict IS NOT DISTINCT FROM CASE WHEN a.correct THEN 'yes' ELSE 'no' END),
               v.reward = s.agrees::int
        FROM selfcheck_verifications s
        JOIN trajectories v ON v.id = s.trajectory_id AND v.run_id = s.run_id
        JOIN trajectories a ON a.id = s.answer_trajectory_id AND a.run_id = s.run_id""")
    assert checks and set(checks) == {("verification", "base", True, True, True, True)}
    assert rows(store, "SELECT count(*) FROM trajectories WHERE origin = 'verification'") == [(len(checks),)]
    [(n, agreement)] = rows(store, "SELECT sum(verifications), avg(agreement) FROM selfcheck_calibration")
    assert n == len(checks) and 0.0 <= agreement <= 1.0
    # its loss terms, metrics and setting reached the learner
    steps = rows(store, "SELECT step, metrics ? 'loss/verify/loss', metrics ? 'selfcheck/agreement' "
                        "FROM learner_steps ORDER BY step")
    assert steps == [(1, True, True), (2, True, True)]
    assert rows(store, "SELECT value FROM run_settings WHERE key = 'selfcheck.verify_weight'") == [(0.5,)]

    # its grants come back when the roles are made again (reflexdb db roles revokes and re-grants
    # everything): the plug-in's sql/roles.sql, run after reflexdb's own
    made = subprocess.run(REFLEXDB + ["db", "roles"], env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    assert rows(store, "SELECT has_table_privilege('reflexdb_collector', 'selfcheck_verifications', 'INSERT'), "
                       "has_table_privilege('reflexdb_collector', 'selfcheck_verifications', 'DELETE')") == [
        (True, False)]
