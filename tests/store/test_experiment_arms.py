"""`benchmarks/experiments/arms.py` against a real database, through the CLI as the experiment
scripts call it: `reflexdb sql` rows and, from `reflexdb compare --json`, a run's learner steps and
training seconds, the same numbers as the query the scripts kept their own copies of."""

from __future__ import annotations

import os
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from reflexdb import TaskIn
from tests.factories import make_group

ARMS = Path(__file__).resolve().parents[2] / "benchmarks" / "experiments" / "arms.py"


def test_training_seconds_and_steps_come_from_compare(store, db_url, tmp_path):
    run = store.create_run("exp-grpo", algorithm="grpo", config={"seed": 0})
    [task] = store.add_tasks(run, [TaskIn(prompt="1+1", ground_truth="2")])
    ids = store.write_group(make_group(np.random.default_rng(0), run, task, size=4)).trajectory_ids
    store.publish_policy(run, 0, "file:///x/v0")
    for step in (1, 2, 3):
        store.record_step(run, step, step - 1, ids, metrics={"reward/mean": step / 8})
        store.publish_policy(run, step, f"file:///x/v{step}", step=step)
    arms = SimpleNamespace(**runpy.run_path(str(ARMS)))
    env = dict(os.environ, REFLEXDB_DATABASE_URL=db_url, REFLEXDB_HOME=str(tmp_path))  # not home_env: the test's server

    t = arms.training(env, "exp-grpo")
    [[seconds, steps]] = arms.sql_rows(env, """
        SELECT extract(epoch FROM max(s.created_at) - min(p.created_at)), max(s.step)
        FROM learner_steps s JOIN policy_versions p ON p.run_id = s.run_id AND p.version = 0""")
    assert t["steps"] == steps == 3 and t["training_s"] == pytest.approx(seconds, abs=1e-6)
    assert t["pass_at_1"] is None  # not evaluated
    # vs_trl.py's batch rewards: NULL-free, rounded in SQL, one a step
    rewards = arms.sql_rows(env, "SELECT round((metrics->>'reward/mean')::numeric, 4) FROM learner_steps "
                                 "WHERE metrics->>'reward/mean' IS NOT NULL ORDER BY step")
    assert rewards == [[0.125], [0.25], [0.375]]
