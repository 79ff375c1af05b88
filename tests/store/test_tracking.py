"""The learner's MLflow run tells the whole story: held-out pass@1 beside the loss (logged by
`reflexdb eval` into the learner's run, and copied from the database when the learner's run starts
after an evaluation); experiments open in MLflow's model-training view."""

from __future__ import annotations

import dataclasses

import numpy as np

from reflexdb import TaskIn
from reflexdb.config import parse_config
from reflexdb.tracking import Tracker
from tests.factories import make_group, setup_run


def test_evaluations_land_in_the_learner_run(store, tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path))
    # MLflow exports the tracking URI it is given into os.environ: restored after the test
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'ml.db'}")
    cfg = parse_config({"run": "story", "model": "tiny", "learner": {"tracking_uri": f"sqlite:///{tmp_path / 'ml.db'}"}})
    run, tasks = setup_run(store, "story", n_tasks=1)
    [held_out] = store.add_tasks(run, [TaskIn(prompt="held out", ground_truth="1", split="eval")])
    store.publish_policy(run, 0, "file:///x/v0", step=0)
    store.publish_policy(run, 1, "file:///x/v1", step=5)
    rng = np.random.default_rng(0)
    for version, right, attempts in ((0, 1, 1), (0, 3, 3)):  # evaluated before the learner's run existed
        g = make_group(rng, run, held_out, size=4, version=version, n_correct=right)
        store.write_group(dataclasses.replace(g, kind="eval", workflow="eval", meta={"attempts": attempts}))

    learner = Tracker(cfg)
    learner.log_evaluations(store, run)  # what the learner does when it creates its run
    evaluation = Tracker(cfg, run_name="story-eval-v1")
    evaluation.log_to_learner({"eval/pass_at_1": 0.75}, 5)  # what `reflexdb eval` does after v1

    history = {k: [(m.step, m.value) for m in learner.client.get_metric_history(learner.run_id, k)]
               for k in ("eval/pass_at_1", "eval/pass_at_1_3_attempts")}
    assert history == {"eval/pass_at_1": [(0, 0.25), (5, 0.75)], "eval/pass_at_1_3_attempts": [(0, 0.75)]}
    assert evaluation.learner_run_id() == learner.run_id
    exp = learner.mlflow.get_experiment_by_name("reflexdb/story")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_no_learner_run_yet_logs_nowhere(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'ml.db'}")
    cfg = parse_config({"run": "alone", "model": "tiny", "learner": {"tracking_uri": f"sqlite:///{tmp_path / 'ml.db'}"}})
    evaluation = Tracker(cfg, run_name="alone-eval-base")
    assert evaluation.learner_run_id() is None
    evaluation.log_to_learner({"eval/pass_at_1": 0.5}, 0)  # nothing, no error
    assert evaluation.client.get_run(evaluation.run_id).data.metrics == {}  # not into its own run either


def test_the_learner_run_links_to_its_explorer_pages(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'ml.db'}")
    monkeypatch.setenv("REFLEXDB_EXPLORER_URL", "http://lab:7001/")
    cfg = parse_config({"run": "a b/c", "model": "tiny", "learner": {"tracking_uri": f"sqlite:///{tmp_path / 'ml.db'}"}})
    learner = Tracker(cfg)
    tags = learner.client.get_run(learner.run_id).data.tags
    assert tags["reflexdb.explorer"] == "http://lab:7001/runs/a%20b%2Fc"  # the run's name quoted whole
    # the description MLflow shows as Markdown: a link to the steps and one to the trajectories
    assert "[this run's learner steps](http://lab:7001/runs/a%20b%2Fc)" in tags["mlflow.note.content"]
    assert "(http://lab:7001/runs/a%20b%2Fc/trajectories)" in tags["mlflow.note.content"]
