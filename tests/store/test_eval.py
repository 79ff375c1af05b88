"""`reflexdb eval` and the learner_eligible view."""

from __future__ import annotations

import os

import numpy as np
import pytest
from reflexdb.collector.evaluate import evaluate, pass_at_k
from sqlalchemy import text

from reflexdb import GroupIn
from reflexdb.config import parse_config
from tests.factories import make_group, setup_run

# Model and process tests (marker model): the model's and DeepSpeed's work, the database incidental; CI's
# embedded pass runs them, its external-server pass skips them (.ci/run).
pytestmark = pytest.mark.model


def test_pass_at_k_by_hand():
    # n=4, c=1, k=1: 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25 (= c/n)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=4, c=0: never; n=4, c=3, k=2: n-c=1 < k -> 1
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 3, 2) == 1.0


def test_eval_stores_eval_groups_and_logs_to_mlflow(store, tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REFLEXDB_MODEL_CACHE", os.environ.get("REFLEXDB_MODEL_CACHE", str(tmp_path / "models")))
    cfg = parse_config({"run": "ev", "model": "tiny", "collector": {"sampling": {"max_new_tokens": 6}}})
    r = evaluate(cfg, store, "base", k=3, max_tasks=4, echo=lambda m: None)
    assert (r.label, r.tasks, r.samples_per_task) == ("base", 4, 3)
    [(n_groups, n_traj, n_correct)] = [tuple(x) for x in store.engine.connect().execute(text(
        "SELECT count(DISTINCT g.id), count(*), count(*) FILTER (WHERE t.correct) FROM groups g "
        "JOIN trajectories t ON t.group_id = g.id WHERE g.kind = 'eval'"))]
    assert (n_groups, n_traj) == (4, 12)
    assert r.pass_at_1 == pytest.approx(n_correct / 12)
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    run = client.get_run(r.mlflow_run_id)
    assert run.data.metrics["eval/pass_at_1"] == pytest.approx(r.pass_at_1)
    assert "eval/pass_at_k" in run.data.metrics and run.data.params["eval.k"] == "3"


def test_eval_shows_a_progress_bar_on_a_terminal_only(store, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REFLEXDB_MODEL_CACHE", os.environ.get("REFLEXDB_MODEL_CACHE", str(tmp_path / "models")))
    cfg = parse_config({"run": "bar", "model": "tiny", "collector": {"sampling": {"max_new_tokens": 4}}})
    evaluate(cfg, store, "base", k=2, max_tasks=2, echo=lambda m: None)
    assert "[eval] base" not in capsys.readouterr().err  # a log or a pipe: no bar
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    evaluate(cfg, store, "base", k=2, max_tasks=2, echo=lambda m: None)
    err = capsys.readouterr().err
    assert "[eval] base" in err and "2/2" in err and "tasks" in err


@pytest.mark.parametrize("environment, used", [
    ({"name": "tool_python", "max_tool_calls": 1, "timeout_s": 2.0, "cpu_s": 2}, "tool_python"),  # tool use, no rollback
    ({"name": "multi_attempt", "max_attempts": 3}, "single"),  # one attempt: the plain prompt
])
def test_eval_runs_the_run_s_own_environment(store, tmp_path, monkeypatch, environment, used):
    import reflexdb.collector.episodes as episodes

    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REFLEXDB_MODEL_CACHE", os.environ.get("REFLEXDB_MODEL_CACHE", str(tmp_path / "models")))
    names, real = [], episodes.environment_factory
    monkeypatch.setattr(episodes, "environment_factory", lambda name, *a: names.append(name) or real(name, *a))
    cfg = parse_config({"run": "ev-env", "model": "tiny", "algorithm": "dapo", "environment": environment,
                        "tasks": {"template": "tool_python" if used == "tool_python" else "plain"},
                        "collector": {"sampling": {"max_new_tokens": 6}}})
    r = evaluate(cfg, store, "base", k=2, max_tasks=1, echo=lambda m: None)
    assert names == [used] and r.tasks == 1


def test_learner_eligible_view(store):
    run, tasks = setup_run(store, "elig")
    rng = np.random.default_rng(0)
    old = store.write_group(make_group(rng, run, tasks[0], version=0))
    fresh = store.write_group(make_group(rng, run, tasks[1], version=2))
    used = store.write_group(make_group(rng, run, tasks[2], version=2))
    ev = store.write_group(GroupIn(run_id=run, task_id=tasks[0], policy_version=2, kind="eval",
                                   trajectories=make_group(rng, run, tasks[0]).trajectories))
    for v in range(3):
        store.publish_policy(run, v, f"v{v}")
    store.record_step(run, 1, 2, used.trajectory_ids[:1])
    store.set_settings(run, {"learner.max_staleness": 1})

    def view():
        with store.engine.connect() as conn:
            return {r.group_id: (r.eligible, r.reason, r.staleness, r.times_consumed) for r in conn.execute(
                text("SELECT * FROM learner_eligible WHERE run_id = :r"), {"r": run})}

    assert view() == {old.group_id: (False, "stale", 2, 0), fresh.group_id: (True, "ok", 0, 0),
                      used.group_id: (False, "consumed", 0, 1), ev.group_id: (False, "eval", 0, 0)}
    store.set_settings(run, {"learner.max_staleness": 2, "learner.max_reuse": 2})
    v = view()
    assert v[old.group_id][:2] == (True, "ok") and v[used.group_id][:2] == (True, "ok")
