"""`reflexdb learn` and `reflexdb run` as processes: two processes, Ctrl-C and resume, kill -9 and resume.

`reflexdb run` starting both processes and evaluating before and after is checked by the quickstart's
test (tests/e2e/test_quickstart.py: the [collect] and [learn] lines, the summary, the eval groups of
base and the last version, the collector stopped with no claim left)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.processes import REFLEXDB, child_env, rows
from tests.store.test_learn import config_data, seed_groups, write_config  # noqa: F401


def test_collect_and_learn_as_two_processes(store, db_url, tmp_path, model_cache):
    cfg = write_config(tmp_path, config_data())
    env = child_env(db_url, tmp_path, model_cache)
    collector = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        learner = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "3"], env=env,
                                 capture_output=True, text=True, timeout=600)
        assert learner.returncode == 0, learner.stderr[-3000:]
        # Let the collector see the last version before stopping it.
        deadline = time.monotonic() + 120
        while rows(store, "SELECT max(policy_version) FROM collectors") < [(2,)] and time.monotonic() < deadline:
            time.sleep(0.2)
        collector.send_signal(signal.SIGTERM)
        _, cerr = collector.communicate(timeout=120)
    finally:
        collector.kill()
    assert collector.returncode == 0, cerr[-3000:]
    # Versions 0 (base) .. 3 published; the collector loaded at least two of them.
    assert rows(store, "SELECT version, step FROM policy_versions ORDER BY 1") == [(0, 0), (1, 1), (2, 2), (3, 3)]
    loaded = {int(v) for v in __import__("re").findall(r"loaded policy v(\d+)", cerr)}
    assert len(loaded) >= 2, cerr[-2000:]
    assert rows(store, "SELECT count(DISTINCT policy_version) FROM groups") >= [(2,)]
    # Every consumed trajectory traces to its group, its policy version and the step that used it.
    traced = rows(store, """
        SELECT count(*), count(g.id), count(s.id), bool_and(s.policy_version - g.policy_version <= 1)
        FROM consumption c JOIN trajectories t ON t.id = c.trajectory_id JOIN groups g ON g.id = t.group_id
        JOIN learner_steps s ON s.id = c.step_id""")
    assert traced == [(24, 24, 24, True)]  # 3 steps x 2 groups x 4 trajectories, staleness within eta
    assert rows(store, "SELECT max(staleness) <= 1 FROM staleness") == [(True,)]
    # The published checkpoint is a plain HF model directory with the recorded hash.
    from reflexdb.trainer.engine import weights_sha256
    from transformers import AutoModelForCausalLM

    [(uri, sha)] = rows(store, "SELECT checkpoint_uri, sha256 FROM policy_versions WHERE version = 3")
    path = uri.removeprefix("file://")
    AutoModelForCausalLM.from_pretrained(path)
    assert weights_sha256(path) == sha
    # ... with the tokenizer and its chat template: plain transformers can chat with it.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    rendered = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}], tokenize=False,
                                       add_generation_prompt=True)
    assert tok.chat_template and "What is 1+1?" in rendered and rendered != "What is 1+1?"
    # Only the newest learner.keep_policies (3) weight directories are kept.
    assert sorted(p.name for p in Path(path).parent.glob("v*")) == ["v1", "v2", "v3"]
    gone = subprocess.run(REFLEXDB + ["eval", "-c", str(cfg), "--checkpoint", "v0"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert gone.returncode == 6 and "the weights of policy v0" in gone.stderr and "keep_policies" in gone.stderr
    # MLflow holds the config and the documented metrics.
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    [exp] = [e for e in client.search_experiments() if e.name == "reflexdb/learn-test"]
    [run] = client.search_runs([exp.experiment_id])
    assert run.data.params["learner.groups_per_step"] == "2"
    for key in ("loss/loss", "reward/mean", "reward/pass_at_1", "groups/none_pass", "staleness/max",
                "policy/entropy", "perf/tokens_per_s", "perf/batch_seconds"):
        assert key in run.data.metrics, key
    assert len(client.get_metric_history(run.info.run_id, "loss/loss")) == 3


def test_reflexdb_run_ctrl_c_stops_cleanly_and_resumes(store, db_url, tmp_path, model_cache):
    cfg = write_config(tmp_path, config_data())
    env = child_env(db_url, tmp_path, model_cache)
    proc = subprocess.Popen(REFLEXDB + ["run", str(cfg), "--max-steps", "50", "--no-eval"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while rows(store, "SELECT count(*) FROM learner_steps") < [(2,)]:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the launcher
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    [(steps,)] = rows(store, "SELECT max(step) FROM learner_steps")
    assert f"interrupted at step {steps} (policy v{steps} published): run the same command to resume" in out
    assert "Traceback" not in err and "abandoned" not in err  # one signal each: finished, not abandoned
    # The learner finished its step and published it; the collector finished its group and stopped.
    assert rows(store, "SELECT max(version) FROM policy_versions") == [(steps,)]
    assert rows(store, "SELECT status FROM collectors") == [("stopped",)]
    assert rows(store, "SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL") == [(0,)]
    again = subprocess.run(REFLEXDB + ["run", str(cfg), "--max-steps", str(steps + 1), "--no-eval"], env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed run 'learn-test' at step {steps}" in again.stderr
    assert rows(store, "SELECT max(step) FROM learner_steps") == [(steps + 1,)]


def test_resume_after_kill_9(store, db_url, tmp_path, model_cache):
    group_ids = seed_groups(store, "learn-test", 16)
    data = config_data(publish_every=3, max_reuse=1)
    data["max_staleness"] = 100  # seeded groups are all version 0
    cfg = write_config(tmp_path, data)
    env = child_env(db_url, tmp_path, model_cache)
    proc = subprocess.Popen(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "8"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while rows(store, "SELECT count(*) FROM learner_steps") < [(4,)]:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)  # step 4 recorded, published only up to step 3
        proc.wait(30)
    finally:
        proc.kill()
    steps_before = rows(store, "SELECT step FROM learner_steps ORDER BY 1")
    assert steps_before[:4] == [(1,), (2,), (3,), (4,)]
    [(mlflow_id,)] = rows(store, "SELECT DISTINCT meta->>'mlflow_run_id' FROM policy_versions")
    again = subprocess.run(REFLEXDB + ["learn", "-c", str(cfg), "--max-steps", "6"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed run 'learn-test' at step 3" in again.stderr
    assert rows(store, "SELECT step FROM learner_steps ORDER BY 1") == [(i,) for i in range(1, 7)]
    # Nothing consumed twice, nothing skipped: the 6 steps took the 12 oldest groups, once each.
    consumed = rows(store, "SELECT group_id, count(DISTINCT step_id) FROM consumption GROUP BY 1 ORDER BY 1")
    assert consumed == [(g, 1) for g in group_ids[:12]]
    assert rows(store, "SELECT count(*) FROM trajectories WHERE times_sampled <> "
                       "(SELECT count(*) FROM consumption c WHERE c.trajectory_id = trajectories.id)") == [(0,)]
    # The MLflow run continued.
    assert rows(store, "SELECT DISTINCT meta->>'mlflow_run_id' FROM policy_versions") == [(mlflow_id,)]
    assert rows(store, "SELECT max(version), max(step) FROM policy_versions") == [(2, 6)]
