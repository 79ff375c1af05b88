"""``reflexdb db archive`` / ``db restore``: a run to Parquet and back, row for row."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest

from reflexdb import NotFound, schema
from reflexdb.ops.archive import SHARED, ArchiveError, archive, restore, tables
from reflexdb.db import libpq_url
from reflexdb.index import EmbeddingIndex
from tests.factories import make_group, make_trajectory, setup_run
from tests.processes import rows

# Views whose rows for the run must be the same after a round trip.
VIEWS = ("group_stats", "learner_eligible", "untrained_groups", "episode_turns", "trajectory_tokens", "failures",
         "staleness", "nexgrpo_negative_pool", "r3l_reflections", "cleaner_tool_errors")


def _a_run(store, name="busy"):
    """A run with a row in every table that can hold one: groups with payloads, turns and
    embeddings, lineage, settings, versions, steps and their consumption, a hint, a reflection, their
    links to trajectories, a rollback, a collector, a replay request and an LTE stage."""
    rng = np.random.default_rng(5)
    run, tasks = setup_run(store, name, n_tasks=3)
    store.set_settings(run, {"learner.max_staleness": 2, "nexgrpo.conf_low": 0.3})
    written = [store.write_group(make_group(rng, run, t, size=4, version=v)) for v in (0, 1) for t in tasks]
    child = make_trajectory(rng, parent_trajectory_id=written[0].trajectory_ids[0], origin="replayed", dim=16)
    written.append(store.write_group(_group(run, tasks[0], [child])))
    store.publish_policy(run, 1, "file:///ckpt/v1", step=1, meta={"learner_state": True})
    # advantages by stage (revision 0023): one value not finite (a NULL element), a row left out (NULL)
    advantages = {t: [0.5, -0.1] for t in written[0].trajectory_ids} | {written[1].trajectory_ids[0]: [float("nan"), 0.0]}
    # per-token signals (revision 0028): one row with every array, one without an advantage or ratio (SFT)
    from reflexdb.records import TokenSignals

    signals = {written[0].trajectory_ids[0]: TokenSignals(np.array([0.5, np.nan]), np.array([0.01, np.nan]),
                                                          np.array([True, False]), np.array([1.5, 2.0])),
               written[0].trajectory_ids[1]: TokenSignals(None, None, np.zeros(3, bool), np.ones(3))}
    store.record_step(run, 1, 0, written[0].trajectory_ids + written[1].trajectory_ids, advantages=advantages,
                      advantage_stages=["group", "clamp_negative"], token_signals=signals)
    tid, gid = written[0].trajectory_ids[1], written[0].group_id
    with store.transaction() as conn:
        conn.execute("INSERT INTO hints (group_id, task_id, kind, wrong_answers, hinted_prompt) "
                     "VALUES (%s, %s, 'wrong_answers', ARRAY['7', '8'], 'hinted')", (gid, tasks[0]))
        (hint,) = conn.execute("SELECT max(id) FROM hints").fetchone()
        (refl,) = conn.execute("INSERT INTO reflections (trajectory_id, raw_text, parsed, pivot, outcome, valid, run_id) "
                               "VALUES (%s, '{}', '{\"outcome\": \"failure\"}', 1, 'failure', true, %s) RETURNING id",
                               (tid, run)).fetchone()
        conn.execute("INSERT INTO trajectory_reflections (trajectory_id, run_id, reflection_id) VALUES (%s, %s, %s)",
                     (written[0].trajectory_ids[2], run, refl))
        conn.execute("INSERT INTO trajectory_hints (trajectory_id, run_id, hint_id) VALUES (%s, %s, %s)",
                     (written[0].trajectory_ids[3], run, hint))
        conn.execute("INSERT INTO purifications (trajectory_id, turn_index, attempts, recovered, similarity, run_id) "
                     "VALUES (%s, 1, 3, true, 0.25, %s)", (tid, run))
        conn.execute("INSERT INTO collectors (run_id, name, host, pid, engine, model, status) "
                     "VALUES (%s, 'c0', 'h', 1, 'hf', 'tiny', 'stopped')", (run,))
        conn.execute("INSERT INTO replay_requests (run_id, task_id, positive_id, negative_id, cosine, group_size, "
                     "learner_step, learner_version) VALUES (%s, %s, %s, %s, 0.5, 8, 1, 1)",
                     (run, tasks[0], written[0].trajectory_ids[0], tid))
        conn.execute("INSERT INTO lte_stages (group_id, run_id) VALUES (%s, %s)", (written[1].group_id, run))
    return run, written


def _group(run, task, trajectories):
    from reflexdb import GroupIn

    return GroupIn(run_id=run, task_id=task, policy_version=1, trajectories=trajectories, kind="replay")


def _dump(store, run_id):
    """Every row of the run, table by table, in key order; and the views' rows of the run."""
    from reflexdb.ops.archive import _query

    out = {}
    with psycopg.connect(libpq_url(store.url)) as conn:
        for table, where, order in tables():
            out[table] = conn.execute(_query(table, where, order, run_id)).fetchall()
        for view in VIEWS:
            out[view] = sorted(map(repr, conn.execute(f"SELECT * FROM {view} WHERE run_id = %s", (run_id,))))
    return out


def test_every_table_is_archived():
    assert {t for t, *_ in tables()} | set(SHARED) == set(schema.full_metadata().tables)


def test_archive_and_restore_round_trip_row_for_row(store, tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEXDB_HOME", str(tmp_path / "home"))
    run, written = _a_run(store)
    other, _ = _a_run(store, "other")
    before, other_before = _dump(store, run), _dump(store, other)
    assert all(before[t] for t, *_ in tables()), [t for t, *_ in tables() if not before[t]]  # a row in every table
    index = EmbeddingIndex.open(store, run)
    index.catch_up()
    near = index.search_trajectory(written[0].trajectory_ids[0], k=5)
    groups = store.read_groups([w.group_id for w in written], embeddings=True)

    result = archive(store, "busy", tmp_path / "arc")
    assert result.rows == {t: len(before[t]) for t, *_ in tables()}
    with pytest.raises(NotFound):
        store.run_id("busy")
    assert rows(store, "SELECT count(*) FROM trajectories WHERE run_id = :r", r=run) == [(0,)]
    assert _dump(store, other) == other_before  # another run is untouched
    manifest = json.loads((tmp_path / "arc" / "manifest.json").read_text())
    assert manifest["run"] == "busy" and manifest["run_id"] == run and manifest["tables"]["token_bytes"]["rows"] == 25

    restored = restore(store, tmp_path / "arc")
    assert restored.run_id == run and restored.rows == result.rows
    assert _dump(store, run) == before
    again = store.read_groups([w.group_id for w in written], embeddings=True)
    for a, b in zip(groups, again):
        for x, y in zip(a.trajectories, b.trajectories):
            assert all(np.array_equal(getattr(x, f), getattr(y, f)) if isinstance(getattr(x, f), np.ndarray)
                       else getattr(x, f) == getattr(y, f) for f in x.__dataclass_fields__)
    index = EmbeddingIndex.open(store, run)
    index.catch_up()
    assert index.search_trajectory(written[0].trajectory_ids[0], k=5) == near
    assert store.latest_policy(run, with_state=True).version == 1  # where `reflexdb learn` resumes


def test_archive_refuses_a_run_in_use_and_a_used_directory(store, tmp_path):
    _a_run(store)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ArchiveError, match="not empty"):
        archive(store, "busy", tmp_path / "full")
    with psycopg.connect(libpq_url(store.url), application_name="reflexdb learn busy"):
        with pytest.raises(ArchiveError, match="in use: reflexdb learn busy"):
            archive(store, "busy", tmp_path / "arc")
    assert store.run_id("busy") and not (tmp_path / "arc").exists()
    with pytest.raises(NotFound):
        archive(store, "nope", tmp_path / "arc2")


def test_restore_refuses_a_changed_file_an_existing_run_and_no_manifest(store, tmp_path):
    _a_run(store)
    archive(store, "busy", tmp_path / "arc")
    with pytest.raises(ArchiveError, match="no manifest.json"):
        restore(store, tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in (tmp_path / "arc").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "turns.parquet").write_bytes((bad / "turns.parquet").read_bytes()[:-10] + b"0" * 10)
    with pytest.raises(ArchiveError, match="turns.parquet changed"):
        restore(store, bad)
    # rows of an origin this database's table does not hold (a method's, not installed here)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for f in (tmp_path / "arc").iterdir():
        (foreign / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((foreign / "manifest.json").read_text())
    assert manifest["origins"] == ["base", "replayed"]
    (foreign / "manifest.json").write_text(json.dumps({**manifest, "origins": [*manifest["origins"], "verified"]}))
    with pytest.raises(ArchiveError, match="origin\\(s\\) verified, which this database's table origins does not hold"):
        restore(store, foreign)
    assert rows(store, "SELECT count(*) FROM runs WHERE name = 'busy'") == [(0,)]
    restore(store, tmp_path / "arc")
    with pytest.raises(ArchiveError, match="a run named 'busy' exists"):
        restore(store, tmp_path / "arc")
