"""`reflexdb collect` on a real store with the tiny random model (processes where it matters)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from reflexdb import Store
from reflexdb.config import parse_config

from .processes import REFLEXDB, child_env, rows

# Model and process tests: run on the embedded pass of CI; the external-server pass skips them.
pytestmark = pytest.mark.slow





def write_config(tmp_path, **collector) -> Path:
    cfg = {
        "run": "collect-test",
        "model": "tiny",
        "collector": {"group_size": 4, "sampling": {"max_new_tokens": 12}, "progress_every_s": 0.5,
                      "poll_interval_s": 0.2, **collector},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path






def assert_only_complete_groups(store, size):
    bad = rows(store, "SELECT g.id, g.size, count(t.id) FROM groups g LEFT JOIN trajectories t ON t.group_id = g.id "
                      "LEFT JOIN token_payloads p ON p.trajectory_id = t.id "
                      "GROUP BY g.id HAVING count(t.id) <> g.size OR count(p.trajectory_id) <> g.size "
                      "OR g.size <> :s", s=size)
    assert bad == []


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


# ---------------------------------------------------------------- in-process (one tiny engine)


@pytest.fixture(scope="module")
def tiny_engine(model_cache):
    from reflexdb.collector.engines import make_engine
    from reflexdb.collector.models import resolve_model

    return make_engine("hf", model=resolve_model("tiny"), device="cpu")


def _collector(cfg_data, store, engine):
    from reflexdb.collector.runner import Collector

    cfg = parse_config({"run": "inproc", "model": "tiny", **cfg_data})
    c = Collector(cfg, store, engine, echo=lambda msg: None)
    c.setup()
    return c


def test_reward_function_errors_are_stored_not_raised(store, tiny_engine):
    from reflexdb.collector.rewards import register_reward

    def broken(response, task):
        raise ZeroDivisionError("reward blew up")

    register_reward("test_broken", broken, replace=True)
    c = _collector({"collector": {"group_size": 3, "reward": "test_broken", "sampling": {"max_new_tokens": 4}}},
                   store, tiny_engine)
    stats = c.run(max_groups=1)
    assert stats.groups == 1 and stats.reward_errors == 3
    got = rows(store, "SELECT reward, error FROM failures")
    assert got == [(None, "ZeroDivisionError: reward blew up")] * 3
    assert rows(store, "SELECT reward_errors FROM collectors") == [(3,)]


def test_a_response_that_decodes_to_nul_is_stored(store, tiny_engine):
    # The tiny random model once sampled a token that decodes to NUL: the collector stopped with
    # "contains a NUL character" (CI). The group is stored, token ids exact, U+FFFD in the text
    # (Sample replaces it for every engine, so eval is covered too).
    import dataclasses

    import numpy as np

    from reflexdb.collector.engines.base import Sample

    e = np.zeros(0, np.float32)
    assert Sample(e, e, e, "stop", "x\x00y\x00", e).text == "x\ufffdy\ufffd"

    class NulEngine:
        def __getattr__(self, name):
            return getattr(tiny_engine, name)

        def generate(self, prompts, n=1, params=None):
            out = tiny_engine.generate(prompts, n, params)
            return [[dataclasses.replace(s, text="a\x00b") for s in ss] for ss in out]

    c = _collector({"collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}}}, store, NulEngine())
    stats = c.run(max_groups=1)
    assert stats.groups == 1
    got = rows(store, "SELECT t.text FROM turns t WHERE t.role = 'assistant'")
    assert got == [("a\ufffdb",)] * 2
    assert all(n > 0 for (n,) in rows(store, "SELECT cardinality(response_ids) FROM token_payloads"))


def test_skipped_dataset_rows_are_counted(store, tiny_engine, tmp_path, caplog):
    data = tmp_path / "mini.jsonl"
    data.write_text('{"question": "What is 1+1?", "answer": "#### 2"}\n'
                    '{"question": "no answer field"}\n'
                    'not json\n'
                    '{"question": "What is 2+2?", "answer": "#### 4"}\n')
    c = _collector({"tasks": {"source": "file", "path": str(data), "eval_size": 0},
                    "collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}}}, store, tiny_engine)
    assert c.stats.skipped_rows == 2
    assert f"{data}:2: skipped row" in caplog.text and f"{data}:3: skipped row" in caplog.text
    assert rows(store, "SELECT skipped_rows FROM collectors") == [(2,)]
    assert rows(store, "SELECT count(*) FROM tasks") == [(2,)]


def test_admission_control_waits_for_the_learner(store, tiny_engine):
    # eta 0, 2 groups per step, a version per step: version 0 may only make groups 0 and 1.
    c = _collector({"max_staleness": 0, "learner": {"groups_per_step": 2, "publish_every": 1},
                    "collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}, "progress_every_s": 0.3,
                                  "poll_interval_s": 0.1}}, store, tiny_engine)
    msgs = []
    c.echo = msgs.append
    c.run(max_seconds=10)  # generous: two groups take seconds on a loaded machine
    assert rows(store, "SELECT count(*) FROM groups") == [(2,)]
    assert any("waiting for policy v1" in m for m in msgs)


def test_reload_picks_up_published_weights(store, tiny_engine, tmp_path, model_cache):
    import torch
    from transformers import AutoModelForCausalLM

    from reflexdb.collector.models import resolve_model

    src = resolve_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    ckpt = tmp_path / "v1"
    model.save_pretrained(ckpt)
    c = _collector({"collector": {"group_size": 2, "sampling": {"max_new_tokens": 4}}}, store, tiny_engine)
    c.run(max_groups=1)
    store.publish_policy(c.run_id, 1, f"file://{ckpt}", step=1)
    msgs = []
    c.echo = msgs.append
    c.run(max_groups=2)
    assert any("loaded policy v1" in m for m in msgs)
    assert rows(store, "SELECT policy_version, count(*) FROM groups GROUP BY 1 ORDER BY 1") == [(0, 1), (1, 1)]
    assert rows(store, "SELECT DISTINCT policy_version FROM collectors") == [(1,)]
    tiny_engine.load_weights(src)  # leave the shared engine as it was


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
