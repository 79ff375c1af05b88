"""`reflexdb compare`: held-out pass@1 per run and per arm with bootstrap intervals, steps, wall
clock, one table and one PNG, all from the database."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflexdb import TaskIn
from reflexdb.ops.compare import arm_of, compare
from reflexdb.errors import NotFound, ReflexdbError
from tests.factories import make_group

CLI = [sys.executable, "-m", "reflexdb.cli.main", "compare"]


def _run(store, name, algorithm, seed, after: list[int], *, before: int = 1, steps: int = 2, k: int = 4,
         evaluated: bool = True, also: dict[int, list[int]] | None = None):
    """A run with 4 eval tasks: k samples each, ``before`` right per task at v0 and ``after[i]``
    right on task i at v``steps``; ``steps`` learner steps whose batch reward/mean is step / 10."""
    rng = np.random.default_rng(seed)
    run = store.create_run(name, algorithm=algorithm, config={"seed": seed})
    evals = store.add_tasks(run, [TaskIn(prompt=f"held out {i}", ground_truth="1", split="eval") for i in range(4)])
    [train] = store.add_tasks(run, [TaskIn(prompt="train", ground_truth="1")])
    ids = store.write_group(make_group(rng, run, train, size=4)).trajectory_ids
    store.publish_policy(run, 0, "file:///x/v0")
    for step in range(1, steps + 1):
        store.record_step(run, step, step - 1, ids, metrics={"reward/mean": step / 10})
        store.publish_policy(run, step, f"file:///x/v{step}", step=step)
    for version, right in [(0, [before] * 4)] + ([(steps, after)] if evaluated else []) + list((also or {}).items()):
        for t, r in zip(evals, right):
            g = make_group(rng, run, t, size=k, version=version, n_correct=r)
            store.write_group(dataclasses.replace(g, kind="eval", workflow="eval", meta={"attempts": 1}))
    return run


def _arms(store):
    _run(store, "cmp-grpo-s0", "grpo", 0, [2, 2, 2, 2])
    _run(store, "cmp-grpo-s1", "grpo", 1, [2, 2, 2, 2])
    _run(store, "cmp-r3l-s0", "r3l", 0, [3, 3, 3, 3], steps=3)
    _run(store, "cmp-r3l-s1", "r3l", 1, [3, 3, 3, 3])
    _run(store, "cmp-opmd-s0", "opmd", 0, [0, 4, 0, 4])
    _run(store, "cmp-raft-s0", "raft", 0, [], evaluated=False)


def test_arms_means_intervals_and_deltas_by_hand(store):
    _arms(store)
    c = compare(store, ["cmp-grpo-s0", "cmp-grpo-s1", "cmp-r3l-s0", "cmp-r3l-s1", "cmp-opmd-s0", "cmp-raft-s0"])
    grpo, r3l, opmd, raft = c.arms
    assert [a.arm for a in c.arms] == ["cmp-grpo", "cmp-r3l", "cmp-opmd", "cmp-raft"]
    # grpo: every task of both runs 2/4 = 0.5: every bootstrap draw is 0.5, so is the interval
    assert (grpo.pass_at_1, grpo.interval, grpo.before) == (0.5, (0.5, 0.5), 0.25)
    # r3l: 3/4 everywhere: 0.75, [0.75, 0.75]; Δ = 0.75 - 0.5 = +0.25, its interval [0.25, 0.25]
    assert (r3l.pass_at_1, r3l.interval) == (0.75, (0.75, 0.75))
    assert r3l.delta == pytest.approx(0.25) and r3l.delta_interval == pytest.approx((0.25, 0.25))
    assert r3l.steps == 2.5 and grpo.steps == 2.0  # steps 3 and 2
    # opmd: one run, tasks 0, 1, 0, 1 (0/4 or 4/4): mean 0.5; a draw of 4 tasks is all zeros with
    # probability (1/2)^4 = 6.25% > 2.5%, all ones likewise: the 95% interval is [0, 1]
    assert opmd.pass_at_1 == 0.5 and opmd.interval == (0.0, 1.0)
    assert opmd.delta == 0.0 and opmd.delta_interval[0] == pytest.approx(-0.5) and opmd.delta_interval[1] == 0.5
    # raft: no evaluation after training: listed, no number
    assert raft.pass_at_1 is None and raft.delta is None and c.missing_eval == ["cmp-raft-s0"]
    run = {r.name: r for r in c.runs}
    assert run["cmp-r3l-s0"].after_version == 3 and run["cmp-r3l-s0"].samples == 16
    assert run["cmp-opmd-s0"].interval == (0.0, 1.0) and run["cmp-grpo-s1"].interval == (0.5, 0.5)
    assert [rw for _, _, rw in run["cmp-r3l-s0"].curve] == pytest.approx([0.1, 0.2, 0.3])
    assert all(r.training_s is not None and r.training_s >= 0 for r in c.runs)
    # by method: the same numbers here (one arm per algorithm)
    by_method = compare(store, ["cmp-r3l-s0", "cmp-grpo-s0"], by="method")
    assert [a.arm for a in by_method.arms] == ["r3l", "grpo"] and by_method.arms[1].delta == pytest.approx(-0.25)


def test_at_version_scores_each_run_at_equal_steps(store):
    # GRPO ran 4 steps, evaluated at v2 (1/4 right per task) and v4 (4/4); R3L ran 2, evaluated at v2 (2/4)
    _run(store, "eq-grpo-s0", "grpo", 0, [4, 4, 4, 4], steps=4, also={2: [1, 1, 1, 1]})
    _run(store, "eq-r3l-s0", "r3l", 0, [2, 2, 2, 2], steps=2)
    last = compare(store, ["eq-grpo-s0", "eq-r3l-s0"])
    assert [r.after_version for r in last.runs] == [4, 2] and last.arms[1].delta == pytest.approx(0.5 - 1.0)
    eq = compare(store, ["eq-grpo-s0", "eq-r3l-s0"], at_version=2)
    # both at v2: GRPO 1/4 = 0.25, R3L 2/4 = 0.5, Δ = 0.5 - 0.25 = +0.25
    assert [r.after_version for r in eq.runs] == [2, 2] and [r.pass_at_1 for r in eq.runs] == [0.25, 0.5]
    assert eq.arms[1].delta == pytest.approx(0.25) and eq.at_version == 2
    assert all(r.after_s is not None and r.after_s >= 0 for r in eq.runs)
    assert eq.runs[0].steps == 4  # the run's own steps are still reported
    # below every trained evaluation: nothing to score, said so
    assert compare(store, ["eq-grpo-s0"], at_version=1).missing_eval == ["eq-grpo-s0"]
    with pytest.raises(ReflexdbError, match="--at-version must be a trained version"):
        compare(store, ["eq-grpo-s0"], at_version=0)


def test_bad_input_names_the_problem(store):
    _run(store, "cmp-one", "grpo", 0, [1, 1, 1, 1])
    with pytest.raises(NotFound, match="no run named 'cmp-nope'"):
        compare(store, ["cmp-one", "cmp-nope"])
    with pytest.raises(ReflexdbError, match="named twice: cmp-one"):
        compare(store, ["cmp-one", "cmp-one"])
    with pytest.raises(ReflexdbError, match="--by must be arm or method"):
        compare(store, ["cmp-one"], by="seed")


def test_arm_names():
    assert arm_of("r3l-oracle-s2") == "r3l-oracle" and arm_of("grpo_seed3") == "grpo"
    assert arm_of("grpo-7") == "grpo" and arm_of("arithmetic-grpo") == "arithmetic-grpo" and arm_of("s1") == "s1"


def test_the_command_prints_the_tables_and_writes_the_png(store, db_url, tmp_path):
    _arms(store)
    env = dict(os.environ, REFLEXDB_DATABASE_URL=db_url, REFLEXDB_HOME=str(tmp_path))
    png = tmp_path / "cmp.png"
    out = subprocess.run(CLI + ["cmp-grpo-s0", "cmp-grpo-s1", "cmp-r3l-s0", "cmp-r3l-s1", "--png", str(png)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    [r3l] = [line for line in out.stdout.splitlines() if line.startswith("cmp-r3l ")]
    assert [c.strip() for c in r3l.split("|")][5:] == ["0.250", "0.750", "[0.750, 0.750]", "+0.250", "[0.250, 0.250]"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    js = subprocess.run(CLI + ["cmp-grpo-s0", "cmp-r3l-s0", "--json", "--by", "method"], env=env,
                        capture_output=True, text=True, timeout=120)
    data = json.loads(js.stdout)
    assert [a["arm"] for a in data["arms"]] == ["grpo", "r3l"] and data["arms"][1]["delta"] == pytest.approx(0.25)
    at = subprocess.run(CLI + ["cmp-grpo-s0", "cmp-r3l-s0", "--at-version", "2"], env=env, capture_output=True,
                        text=True, timeout=120)
    assert at.returncode == 0, at.stderr
    assert "no held-out evaluation after training at or below v2 for: cmp-r3l-s0" in at.stdout  # r3l-s0 at v3 only
    bad = subprocess.run(CLI + ["cmp-grpo-s0", "nope"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "no run named 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_runs_saved_from_one_database_compare_beside_runs_of_another(store, tmp_path):
    """--save-runs on one machine, --runs-from on another: the same numbers as from the database,
    and runs of both pooled into one arm."""
    from reflexdb.ops.compare import load_records, save_records

    _arms(store)
    names = ["cmp-grpo-s0", "cmp-grpo-s1", "cmp-r3l-s0", "cmp-r3l-s1"]
    from_db = compare(store, names)
    save_records(from_db.records, tmp_path / "runs.json")
    recorded = load_records([tmp_path / "runs.json"])
    from_file = compare(None, names, recorded=recorded)
    assert [(r.name, r.after_version, r.after_s, r.pass_at_1, r.interval, r.before_pass_at_1, r.steps, r.curve)
            for r in from_file.runs] == [(r.name, r.after_version, r.after_s, r.pass_at_1, r.interval,
                                          r.before_pass_at_1, r.steps, r.curve) for r in from_db.runs]
    assert [a.__dict__ for a in from_file.arms] == [a.__dict__ for a in from_db.arms]
    # seed 1 of each arm "on this machine", seed 0 from the file: one arm each, the same means
    pooled = compare(store, names, recorded={n: recorded[n] for n in ("cmp-grpo-s0", "cmp-r3l-s0")})
    assert [a.runs for a in pooled.arms] == [["cmp-grpo-s0", "cmp-grpo-s1"], ["cmp-r3l-s0", "cmp-r3l-s1"]]
    assert pooled.arms[1].delta == pytest.approx(0.25)
    assert [r.source for r in pooled.records] == [str(tmp_path / "runs.json"), "database"] * 2
