"""`reflexdb compare` from run records (no database): equal wall clock (``at_seconds``), files of
records written on one machine and read on another, pooled into one arm, and bad files refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reflexdb.ops.compare import RECORDS_FORMAT, RunRecord, compare, load_records, save_records
from reflexdb.errors import NotFound, ReflexdbError

CLI = [sys.executable, "-m", "reflexdb.cli.main", "compare"]


def _rec(name, method, *, evals, published, steps=None):
    """A run of 4 eval tasks, 4 samples each: ``evals`` version -> correct per task."""
    return RunRecord(name=name, method=method, seed=name[-1], steps=steps or max(published), training_s=max(published.values()),
                     evals={v: [(4, c) for c in cs] for v, cs in evals.items()}, published=published,
                     curve=[(s, published[s], s / 10) for s in sorted(published) if s > 0])


def _fast_and_slow():
    # the baseline made 20 steps in 1,000 s (v20 at 1,000 s); the method is slower: v10 at 950 s,
    # v20 at 2,000 s. Evaluated: baseline v0, v20; method v0, v10, v20.
    fast = _rec("base-s0", "dapo", evals={0: [0, 0, 0, 0], 20: [2, 2, 2, 2]},
                published={0: 0.0, 10: 500.0, 20: 1000.0})
    slow = _rec("meth-s0", "cleaner", evals={0: [0, 0, 0, 0], 10: [1, 1, 1, 1], 20: [3, 3, 3, 3]},
                published={0: 0.0, 10: 950.0, 20: 2000.0})
    return {"base-s0": fast, "meth-s0": slow}


def test_at_seconds_scores_each_run_at_equal_wall_clock():
    recs = _fast_and_slow()
    last = compare(None, [], recorded=recs)
    # at the last version: 2/4 = 0.5 against 3/4 = 0.75, Δ = +0.25
    assert [r.after_version for r in last.runs] == [20, 20] and last.arms[1].delta == pytest.approx(0.25)
    eq = compare(None, [], recorded=recs, at_seconds=1000)
    # by 1,000 s: the baseline's v20 (published at 1,000 s, 0.5), the method's v10 (950 s, 1/4 = 0.25):
    # Δ = 0.25 - 0.5 = -0.25; the interval is a point because every task scores alike
    assert [r.after_version for r in eq.runs] == [20, 10] and [r.after_s for r in eq.runs] == [1000.0, 950.0]
    assert eq.arms[1].delta == pytest.approx(-0.25) and eq.arms[1].delta_interval == pytest.approx((-0.25, -0.25))
    assert eq.at_seconds == 1000 and eq.as_dict()["at_seconds"] == 1000
    # before any trained evaluation was published (v10 at 950 s, v20 at 1,000 s): nothing to score, said so
    early = compare(None, [], recorded=recs, at_seconds=900)
    assert early.missing_eval == ["base-s0", "meth-s0"]
    # what to evaluate to score them: the baseline's v10 was published at 500 s (never evaluated);
    # the method published nothing trained by 900 s
    assert early.evaluate == {"base-s0": 10, "meth-s0": None} and early.as_dict()["evaluate"] == early.evaluate
    # both bounds at once: at or below v10 and by 1,000 s
    both = compare(None, [], recorded=recs, at_seconds=1000, at_version=10)
    assert [r.after_version for r in both.runs] == [None, 10] and both.missing_eval == ["base-s0"]
    assert both.evaluate == {"base-s0": 10}
    for bad in (0, -5, float("inf"), float("nan")):
        with pytest.raises(ReflexdbError, match="--at-seconds must be a number of seconds above 0"):
            compare(None, [], recorded=recs, at_seconds=bad)


def test_records_round_trip_through_a_file_and_pool_into_one_arm(tmp_path):
    recs = _fast_and_slow()
    one, two = tmp_path / "machine-a.json", tmp_path / "machine-b.json"
    save_records([recs["base-s0"], recs["meth-s0"]], one)
    doc = json.loads(one.read_text())
    assert doc["format"] == RECORDS_FORMAT and [r["name"] for r in doc["runs"]] == ["base-s0", "meth-s0"]
    # a second seed, recorded elsewhere: baseline 4/4 on every task at v20, method 1/4 at v20
    save_records([_rec("base-s1", "dapo", evals={20: [4, 4, 4, 4]}, published={0: 0.0, 20: 900.0}),
                  _rec("meth-s1", "cleaner", evals={20: [1, 1, 1, 1]}, published={0: 0.0, 20: 1900.0})], two)
    loaded = load_records([one, two])
    assert loaded["meth-s0"].evals == recs["meth-s0"].evals and loaded["meth-s0"].published == recs["meth-s0"].published
    assert loaded["base-s0"].curve == recs["base-s0"].curve and loaded["meth-s0"].source == str(one)
    c = compare(None, ["base-s0", "base-s1", "meth-s0", "meth-s1"], recorded=loaded)
    base, meth = c.arms
    # baseline arm (0.5 + 1.0) / 2 = 0.75; method (0.75 + 0.25) / 2 = 0.5; Δ = -0.25
    assert base.runs == ["base-s0", "base-s1"] and base.pass_at_1 == pytest.approx(0.75)
    assert meth.pass_at_1 == pytest.approx(0.5) and meth.delta == pytest.approx(-0.25)
    assert base.before == 0.0  # only base-s0 has a v0 evaluation
    # records pass through a comparison unchanged, in the order named (what --save-runs writes)
    assert [r.name for r in c.records] == ["base-s0", "base-s1", "meth-s0", "meth-s1"]


def test_bad_record_files_are_refused_naming_the_file(tmp_path):
    good = tmp_path / "good.json"
    save_records([_fast_and_slow()["base-s0"]], good)
    with pytest.raises(NotFound, match="nope.json: no such file of run records"):
        load_records([tmp_path / "nope.json"])
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ReflexdbError, match="junk.json: not a file of run records"):
        load_records([tmp_path / "junk.json"])
    (tmp_path / "other.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ReflexdbError, match="other.json: not a file of run records .*--save-runs"):
        load_records([tmp_path / "other.json"])
    bad = json.loads(good.read_text())
    bad["runs"][0]["evals"]["20"][0] = [4, 5]  # 5 correct of 4 samples
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ReflexdbError, match="bad.json: a run record is malformed .*0 <= correct <= samples"):
        load_records([tmp_path / "bad.json"])
    del bad["runs"][0]["name"]
    (tmp_path / "noname.json").write_text(json.dumps(bad))
    with pytest.raises(ReflexdbError, match="noname.json: a run record is malformed"):
        load_records([tmp_path / "noname.json"])
    with pytest.raises(ReflexdbError, match="'base-s0' is in two files of run records"):
        load_records([good, good])
    with pytest.raises(NotFound, match="no run record named 'elsewhere' in the files given"):
        compare(None, ["base-s0", "elsewhere"], recorded=load_records([good]))


def test_the_command_compares_recorded_runs_without_a_database(tmp_path):
    f = tmp_path / "runs.json"
    save_records(list(_fast_and_slow().values()), f)
    env = {"REFLEXDB_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "REFLEXDB_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}  # never opened
    out = subprocess.run(CLI + ["--runs-from", str(f), "--at-seconds", "1000", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["after_version"] for r in data["runs"]] == [20, 10] and data["arms"][1]["delta"] == pytest.approx(-0.25)
    again = tmp_path / "again.json"
    table = subprocess.run(CLI + ["meth-s0", "--runs-from", str(f), "--save-runs", str(again)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert f"run records: {again}" in table.stdout
    assert [r.name for r in load_records([again]).values()] == ["meth-s0"]
    # a run with no evaluation within the bounds: the hint names the version to evaluate, per run
    hint = subprocess.run(CLI + ["--runs-from", str(f), "--at-seconds", "900"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert hint.returncode == 0, hint.stderr
    assert "no held-out evaluation after training published by 900 s for: base-s0, meth-s0" in hint.stdout
    assert "base-s0: reflexdb eval -c CONFIG --set run=base-s0 --checkpoint v10" in hint.stdout
    assert "meth-s0: no trained version published by 900 s" in hint.stdout
    bad = subprocess.run(CLI + ["--runs-from", str(tmp_path / "missing.json")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "missing.json: no such file of run records" in bad.stderr
    assert "Traceback" not in bad.stderr
    none = subprocess.run(CLI, env=env, capture_output=True, text=True, timeout=120)
    assert none.returncode != 0 and "name at least one run to compare" in none.stderr and "Traceback" not in none.stderr
