"""`reflexdb collect` as a process: signals, outages, concurrent collectors, bad configs."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import yaml

from reflexdb import Store
from tests.processes import REFLEXDB, child_env, rows
from tests.store.test_collect import assert_only_complete_groups, write_config  # noqa: F401


def test_bad_config_stops_at_start(db_url, tmp_path, model_cache):
    env = child_env(db_url, tmp_path, model_cache)
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: x\ncollector:\n  group_sise: 4\n")
    proc = subprocess.run(REFLEXDB + ["collect", "-c", str(bad)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "collector.group_sise: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr
    bad.write_text("run: x\nmodel: /nonexistent/model\n")
    proc = subprocess.run(REFLEXDB + ["collect", "-c", str(bad)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "/nonexistent/model" in proc.stderr and "Traceback" not in proc.stderr
    bad.write_text("run: x\ncollector:\n  reward: no_such_reward\n")
    proc = subprocess.run(REFLEXDB + ["collect", "-c", str(bad)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "no_such_reward" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(REFLEXDB + ["collect", "-c", str(tmp_path / "missing.yaml")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_collect_writes_complete_groups(store, db_url, tmp_path, model_cache):
    cfg = write_config(tmp_path)
    proc = subprocess.run(REFLEXDB + ["collect", "-c", str(cfg), "--max-groups", "3"],
                          env=child_env(db_url, tmp_path, model_cache), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "groups 3" in proc.stderr
    assert rows(store, "SELECT count(*) FROM groups") == [(3,)]
    assert_only_complete_groups(store, 4)
    # Everything the methods need is stored for each trajectory.
    [(n, with_emb, conf_ok, turns)] = rows(store, """
        SELECT count(*), count(e.trajectory_id), bool_and(t.confidence BETWEEN 0 AND 1),
               min((SELECT count(*) FROM turns u WHERE u.trajectory_id = t.id))
        FROM trajectories t LEFT JOIN embeddings e ON e.trajectory_id = t.id""")
    assert (n, with_emb, conf_ok) == (12, 12, True) and turns >= 2
    # Every reward was computed (the built-in math reward never fails on a plain response).
    assert rows(store, "SELECT count(*) FROM trajectories WHERE reward IS NULL OR error IS NOT NULL") == [(0,)]
    # Claims were completed (counted) and released.
    assert rows(store, "SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL") == [(0,)]
    assert rows(store, "SELECT sum(times_collected) FROM tasks") == [(3,)]
    assert rows(store, "SELECT status, groups_written, trajectories_written FROM collectors") == [("stopped", 3, 12)]


def test_database_away_for_a_while_loses_nothing(tmp_path, model_cache):
    """The server stops mid-run for several seconds; the collector retries and writes every group."""
    import shutil
    import tempfile

    from reflexdb import embedded, migrate
    from reflexdb.db import make_engine

    root = Path(tempfile.mkdtemp(prefix="reflexdb-test-away-"))
    pgdata = (root / "data").resolve()
    url = embedded.server_uri(pgdata)
    engine = make_engine(url)
    migrate.upgrade(engine)
    store = Store(engine)
    cfg = write_config(tmp_path, group_size=4, sampling={"max_new_tokens": 24}, db_retry_s=90)
    env = child_env(url, tmp_path, model_cache)
    proc = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg), "--max-groups", "6"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while rows(store, "SELECT count(*) FROM groups") == [(0,)]:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        engine.dispose()
        assert embedded.stop(pgdata)
        time.sleep(8)  # the collector keeps generating, and its writes fail meanwhile
        server = embedded._servers[pgdata]
        with server._lock:
            server.ensure_postgres_running()
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    try:
        assert proc.returncode == 0, err
        assert "database unreachable" in err
        assert rows(store, "SELECT count(*) FROM groups") == [(6,)]
        assert_only_complete_groups(store, 4)
        assert rows(store, "SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL") == [(0,)]
    finally:
        store.close()
        embedded.stop(pgdata)
        shutil.rmtree(root, ignore_errors=True)


def test_second_signal_abandons_the_group(store, db_url, tmp_path, model_cache):
    cfg = write_config(tmp_path, sampling={"max_new_tokens": 2000}, group_size=8)  # long generations
    proc = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg)], env=child_env(db_url, tmp_path, model_cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while rows(store, "SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL") == [(0,)]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "abandoned the in-flight group" in err
    assert rows(store, "SELECT count(*) FROM groups") == [(0,)]
    assert rows(store, "SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL") == [(0,)]


def test_sigterm_finishes_in_flight_group_and_exits_zero(store, db_url, tmp_path, model_cache):
    cfg = write_config(tmp_path, sampling={"max_new_tokens": 64}, group_size=8)
    proc = subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg)], env=child_env(db_url, tmp_path, model_cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while rows(store, "SELECT count(*) FROM groups") == [(0,)] and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "finishing the in-flight group" in err
    assert_only_complete_groups(store, 8)
    assert rows(store, "SELECT count(*) FROM tasks WHERE claimed_by IS NOT NULL") == [(0,)]
    assert rows(store, "SELECT status FROM collectors") == [("stopped",)]


def test_two_collectors_never_duplicate_work(store, db_url, tmp_path, model_cache):
    cfg = write_config(tmp_path, max_collections=1, tasks_per_batch=4)
    with open(cfg) as f:
        data = yaml.safe_load(f)
    data["tasks"] = {"train_size": 16, "eval_size": 0}
    cfg.write_text(yaml.safe_dump(data))
    env = child_env(db_url, tmp_path, model_cache)
    procs = [subprocess.Popen(REFLEXDB + ["collect", "-c", str(cfg), "--name", f"c{i}", "--max-seconds", "240"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "every task has been collected" in err
    per_task = rows(store, "SELECT task_id, count(*) FROM groups GROUP BY 1")
    assert len(per_task) == 16 and all(n == 1 for _, n in per_task)
    by_collector = dict(rows(store, "SELECT collector, count(*) FROM groups GROUP BY 1"))
    assert sum(by_collector.values()) == 16
