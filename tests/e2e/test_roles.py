"""Least-privilege roles as the commands use them (child processes)."""

from __future__ import annotations

import subprocess
import time

from sqlalchemy.engine import make_url

from tests.processes import REFLEXDB, child_env, rows
from tests.store.test_learn import config_data, write_config
from tests.store.test_roles import PASSWORD, _as, _refused, roles  # noqa: F401


def test_a_collector_works_under_its_role_and_is_refused_the_rest(roles, store, db_url, tmp_path, model_cache):
    """Started before the learner: the collector role may not create the run (nor record its
    embedding dimension), so the collector says so and waits; once the learner's side has done both
    it collects."""
    cfg = write_config(tmp_path, config_data())
    env = child_env(roles["collector"], tmp_path, model_cache)
    err = tmp_path / "collect.err"
    with open(err, "w") as sink:
        proc = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg), "--max-groups", "2"], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=sink)
    try:
        deadline = time.monotonic() + 180
        while "waiting for `reflexdb learn`" not in err.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.2)
        assert ("run 'learn-test' does not exist yet, and this login may not create runs (the collector role): "
                "waiting for `reflexdb learn` of the run to start (it does both)") in err.read_text()
        run = store.create_run("learn-test")  # what the learner does at start
        store.record_embedding_dim(run, 64, "tiny")
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.read_text()[-3000:]
    assert rows(store, "SELECT count(*), min(collector) IS NOT NULL FROM groups") == [(2, True)]
    assert PASSWORD not in out + err.read_text()
    refused = [
        "DELETE FROM trajectories", "DELETE FROM groups", "DELETE FROM tasks", "UPDATE trajectories SET reward = 0",
        "UPDATE groups SET kind = 'eval'", "UPDATE token_bytes SET logprobs = logprobs",
        "UPDATE embeddings SET dim = dim", "SELECT config FROM runs", "SELECT * FROM learner_steps",
        "SELECT * FROM consumption", "INSERT INTO policy_versions (run_id, version, checkpoint_uri) VALUES (1, 99, 'x')",
        "UPDATE run_settings SET value = '1'", "SELECT * FROM learner_eligible", "TRUNCATE trajectories",
        "INSERT INTO runs (name) VALUES ('planted')", "UPDATE runs SET embedding_dim = 1",
    ]
    assert _refused(roles["collector"], refused) == refused
    # ... while what a collector does is allowed (rolled back here).
    assert _refused(roles["collector"], ["SELECT id, name FROM runs", "SELECT * FROM policy_versions",
                                         "UPDATE tasks SET claimed_by = NULL", "SELECT * FROM run_settings"]) == []


def test_a_reader_reads_everything_and_changes_nothing(roles, store, tmp_path):
    run = store.create_run("r")
    store.publish_policy(run, 0, "file:///v0")
    tables = [t for (t,) in rows(store, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    assert _refused(roles["reader"], [f"SELECT count(*) FROM {t}" for t in tables]) == []
    writes = ["INSERT INTO runs (name) VALUES ('x')", "UPDATE runs SET name = 'y'", "DELETE FROM policy_versions"]
    assert _refused(roles["reader"], writes) == writes
    env = child_env(roles["reader"], tmp_path, tmp_path)
    out = subprocess.run(REFLEXDB + ["sql", "SELECT version FROM policy_versions"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.splitlines()[2].strip() == "0", out.stderr


def test_db_user_refuses_an_unknown_role_and_roles_before_db_roles(db_url, tmp_path):
    env = child_env(db_url, tmp_path, tmp_path)
    out = subprocess.run(REFLEXDB + ["db", "user", "x", "--role", "admin", "--no-password"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "unknown role 'admin': choose one of collector, learner, reader" in out.stderr


def test_no_password_in_logs_mlflow_params_or_stored_config(store, db_url, tmp_path, model_cache):
    data = dict(config_data(), max_staleness=100)
    data["database_url"] = _as(db_url, make_url(db_url).username or "postgres")  # a URL holding a password
    cfg = write_config(tmp_path, data)
    env = child_env(db_url, tmp_path, model_cache)
    env.pop("REFLEXDB_DATABASE_URL")  # the config's URL is the one used
    for args in (["collect", "--max-groups", "2"], ["learn", "--max-steps", "1"]):
        out = subprocess.run(REFLEXDB + args + ["-c", str(cfg)], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        assert PASSWORD not in out.stdout + out.stderr
    [(config,)] = rows(store, "SELECT config::text FROM runs WHERE name = 'learn-test'")
    assert PASSWORD not in config and ":***@" in config
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    [exp] = [e for e in client.search_experiments() if e.name == "reflexdb/learn-test"]
    [run] = client.search_runs([exp.experiment_id])
    assert run.data.params["database_url"].count("***") == 1
    assert not any(PASSWORD in str(v) for v in run.data.params.values())


def test_roles_by_a_login_that_may_not_create_roles_is_a_clear_error(roles, tmp_path):
    """A collector's login trying `reflexdb db roles` gets one line, not a psycopg traceback."""
    env = child_env(roles["collector"], tmp_path, tmp_path)
    for args in (["db", "roles"], ["db", "user", "someone", "--role", "reader", "--no-password"]):
        out = subprocess.run(REFLEXDB + args, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, out.stderr
        assert "nothing was changed" in out.stderr and "Traceback" not in out.stderr
