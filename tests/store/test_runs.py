"""`reflexdb runs`: list, show, delete — with held-out pass@1 first and last, and no delete while a
process of the run is alive."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import psycopg

from reflexdb import TaskIn
from reflexdb.db import libpq_url
from tests.factories import make_group, setup_run
from tests.processes import rows

RUNS = [sys.executable, "-m", "reflexdb.cli.main", "runs"]


def _runs(args, db_url, home, stdin=subprocess.DEVNULL):
    env = dict(os.environ, REFLEXDB_DATABASE_URL=db_url, REFLEXDB_HOME=str(home))
    return subprocess.run(RUNS + args, env=env, capture_output=True, text=True, timeout=120, stdin=stdin)


def _a_run(store, name="demo", published="file:///x"):
    """4 training groups of 4 at versions 0..1, 2 steps, and held-out evals at v0 (1 of 4 right per
    task: 0.25) and v2 (3 of 4: 0.75), plus a 3-attempt eval at v2 that the list leaves out.
    Versions 1 and 2 are recorded at ``<published>/vK``."""
    rng = np.random.default_rng(0)
    run, tasks = setup_run(store, name, n_tasks=2)
    evals = store.add_tasks(run, [TaskIn(prompt=f"held out {i}", ground_truth="1", split="eval") for i in range(2)])
    ids = []
    for v in (0, 1):
        for t in tasks:
            ids += store.write_group(make_group(rng, run, t, size=4, version=v)).trajectory_ids
    for v, step in ((1, 1), (2, 2)):
        store.record_step(run, step, v - 1, ids[:4])
        store.publish_policy(run, v, f"{published}/v{v}", step=step)
    for v, right, attempts in ((0, 1, 1), (2, 3, 1), (2, 4, 3)):
        for t in evals:
            g = make_group(rng, run, t, size=4, version=v, n_correct=right)
            store.write_group(dataclasses.replace(g, kind="eval", workflow="eval", meta={"attempts": attempts}))
    return run


def test_list_and_show(store, db_url, tmp_path):
    _a_run(store)
    setup_run(store, "empty-run", n_tasks=1)
    out = _runs([], db_url, tmp_path)
    assert out.returncode == 0, out.stderr
    [demo] = [line for line in out.stdout.splitlines() if line.startswith("demo ")]
    cells = [c.strip() for c in demo.split("|")]
    # run | method | steps | latest | trajectories | size | pass@1 first | last
    assert cells[:5] == ["demo", "-", "2", "v2", "40"]  # 16 training + 24 eval rows
    assert cells[6:] == ["0.250 (v0)", "0.750 (v2)"]
    assert any(line.startswith("empty-run ") and line.rstrip().endswith("-") for line in out.stdout.splitlines())
    show = _runs(["show", "demo"], db_url, tmp_path)
    assert show.returncode == 0, show.stderr
    assert "2 steps, latest version v2" in show.stdout and "running now: nothing" in show.stdout
    assert "16 trajectories" not in show.stdout and "40 trajectories in 4 training groups" in show.stdout
    evals = [line for line in show.stdout.splitlines() if line.startswith("v") and not line.startswith("version")]
    assert [line.split("|")[:3] for line in evals][0][0].strip() == "v0"
    assert [c.strip() for c in evals[-1].split("|")[:3]] == ["v2", "3", "1.000"]
    missing = _runs(["show", "dmeo"], db_url, tmp_path)
    assert missing.returncode != 0 and "no run named 'dmeo' (did you mean 'demo'?)" in missing.stderr


def test_delete_is_refused_while_the_run_is_alive(store, db_url, tmp_path):
    ckpt = tmp_path / "checkpoints" / "demo"  # where runs published before they had <name>.r<id>
    run = _a_run(store, published=f"file://{ckpt}")
    (ckpt / "v1").mkdir(parents=True)
    (ckpt / "states" / "v1").mkdir(parents=True)
    # a learner of the run, connected (processes name their sessions `reflexdb <role> <run>`)
    with psycopg.connect(libpq_url(db_url), application_name="reflexdb learn demo"):
        busy = _runs(["delete", "demo", "--yes"], db_url, tmp_path)
        assert busy.returncode != 0 and "run 'demo' is in use: reflexdb learn demo (pid " in busy.stderr
    # no --yes and no terminal: asks, gets no answer, deletes nothing
    asked = _runs(["delete", "demo"], db_url, tmp_path)
    assert asked.returncode != 0 and rows(store, "SELECT count(*) FROM runs WHERE id = :r", r=run) == [(1,)]
    done = _runs(["delete", "demo", "--yes"], db_url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("deleted run 'demo': 40 trajectories, 2 steps")
    assert rows(store, "SELECT count(*) FROM runs WHERE id = :r", r=run) == [(0,)]
    assert rows(store, "SELECT count(*) FROM trajectories WHERE run_id = :r", r=run) == [(0,)]
    assert not ckpt.exists()


def test_a_collector_heartbeat_keeps_a_run(store, db_url, tmp_path):
    run = _a_run(store)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO collectors (run_id, name, host, pid, engine, model) "
                             f"VALUES ({run}, 'c0', 'hostA', 4242, 'hf', 'tiny')")
    busy = _runs(["delete", "demo", "--yes"], db_url, tmp_path)
    assert busy.returncode != 0 and "c0 (pid 4242 on hostA)" in busy.stderr


def test_no_runs_says_how_to_make_one(store, db_url, tmp_path):
    out = _runs([], db_url, tmp_path)
    assert out.returncode == 0 and "no runs yet" in out.stdout


def test_delete_of_a_run_publishing_to_storage_keeps_its_objects_with_keep_files(store, db_url, tmp_path):
    """learner.checkpoint_url in object storage (issue 54), --keep-files: the rows go; the local
    directory and the objects in storage are not touched (nothing is asked of storage). Deleting the
    objects: tests/store/test_storage_s3.py."""
    run = store.create_run("remote", config={"run": "remote", "learner": {"checkpoint_url": "s3://bucket/remote/"}})
    ckpt = tmp_path / "checkpoints" / "remote"
    (ckpt / "v1").mkdir(parents=True)
    done = _runs(["delete", "remote", "--yes", "--keep-files"], db_url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deleted run 'remote': 0 trajectories, 0 steps; files kept"
    assert rows(store, "SELECT count(*) FROM runs WHERE id = :r", r=run) == [(0,)] and (ckpt / "v1").exists()


def test_a_planted_config_names_no_directory_runs_delete_removes(store, db_url, tmp_path):
    """A runs row inserted with a config that names someone else's directory (as the collector role
    could before issue 60): `runs delete` removes only what the run's policy_versions rows recorded
    in the run's own places; a row naming a place that is not one (here /x/vK) is left."""
    victim = tmp_path / "victim"
    (victim / "v1").mkdir(parents=True)
    store.create_run("planted", config={"run": "planted", "learner": {"checkpoint_dir": str(victim)}})
    done = _runs(["delete", "planted", "--yes"], db_url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deleted run 'planted': 0 trajectories, 0 steps" and (victim / "v1").is_dir()
    _a_run(store, "elsewhere", published=f"file://{victim}")  # rows naming a directory that is not the run's own
    done = _runs(["delete", "elsewhere", "--yes"], db_url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (victim / "v1").is_dir()  # no weights there match the recorded ones: left
