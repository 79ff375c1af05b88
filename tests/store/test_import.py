"""reflexdb import: JSONL/Parquet rows become trajectories of origin 'imported', never trained;
a run's failures round-trip through Parquet (export, import) with equal token ids and texts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reflexdb import GroupIn, TurnIn
from reflexdb.ops.export import export
from reflexdb.ops.importer import ImportFailed, Tokenizer, import_file
from tests.factories import make_trajectory, setup_run
from tests.processes import rows


@pytest.fixture
def tok(model_cache):
    from reflexdb.models import resolve_model

    return Tokenizer(resolve_model("tiny"))


def _failures(store):
    rng = np.random.default_rng(0)
    run, tasks = setup_run(store, "source", n_tasks=2)
    for k, task in enumerate(tasks):
        trajs = [make_trajectory(rng, T=4 + j, P=5, dim=None, reward=float(j == 0), correct=j == 0,
                                 response_ids=rng.integers(0, 1000, 4 + j), prompt_ids=rng.integers(0, 1000, 5),
                                 turns=[TurnIn("user", f"What is {k}+3?"), TurnIn("assistant", f"it is {k}{j}", 0, 4 + j)])
                 for j in range(3)]
        store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=trajs))
    return run


def test_failures_round_trip_through_parquet_with_equal_tokens_and_texts(store, db_url, tmp_path, tok):
    _failures(store)
    out = tmp_path / "failures.parquet"
    export(db_url, "SELECT * FROM failures WHERE run = 'source'", out)
    target = store.create_run("target")
    stats = import_file(store, target, out, tok)
    assert (stats.rows, stats.imported, stats.groups, stats.bad) == (4, 4, 2, [])

    def payloads(run):
        return sorted(rows(store, "SELECT p.prompt_ids, p.response_ids, u.text, k.prompt, t.reward, t.correct "
                                  "FROM trajectories t JOIN token_payloads p ON p.trajectory_id = t.id "
                                  "JOIN turns u ON u.trajectory_id = t.id AND u.role = 'assistant' "
                                  "JOIN tasks k ON k.id = t.task_id WHERE t.run_id = :r AND NOT t.correct", r=run))

    assert payloads(target) == payloads(store.run_id("source"))
    assert rows(store, "SELECT DISTINCT t.origin, g.kind, g.workflow, p.logprobs IS NULL, t.confidence IS NULL "
                       "FROM trajectories t JOIN groups g ON g.id = t.group_id "
                       "JOIN token_payloads p ON p.trajectory_id = t.id WHERE t.run_id = :r", r=target) == [
        ("imported", "imported", "import", True, True)]
    # never trained, never called untrained
    assert rows(store, "SELECT DISTINCT eligible, reason FROM learner_eligible WHERE run_id = :r", r=target) == [
        (False, "imported")]
    assert rows(store, "SELECT count(*) FROM untrained_groups WHERE run_id = :r", r=target) == [(0,)]
    # the same import again writes nothing twice
    import_file(store, target, out, tok)
    assert rows(store, "SELECT count(*) FROM trajectories WHERE run_id = :r", r=target) == [(4,)]


def test_text_rows_are_tokenised_and_bad_rows_are_reported_with_file_and_line(store, tmp_path, tok):
    lines = [
        {"prompt": "What is 2+2?", "completion": "4", "reward": 1.0},
        {"messages": [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "3"}],
         "reward": 0},
        {"prompt": "no completion"},
        "not json at all",
        {"prompt": "What is 2+2?", "completion": "5", "reward": "high"},
        {"prompt": "x", "completion": "y", "prompt_ids": [1, 2]},
        {"prompt": "x", "completion": "y", "prompt_ids": [1], "completion_ids": [10**9]},
        {"prompt": "What is 2+2?", "completion": "four", "reward": None},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    run = store.create_run("imported")
    stats = import_file(store, run, path, tok, batch_size=3)
    assert (stats.rows, stats.imported) == (8, 3)
    assert stats.bad == [
        f"{path}:3: needs 'prompt' and 'completion' (or 'messages')",
        f"{path}:4: not JSON (Expecting value at column 1)",
        f"{path}:5: reward must be a finite number or null, got 'high'",
        f"{path}:6: give both prompt_ids and completion_ids, or neither",
        f"{path}:7: completion_ids holds an id outside the tokenizer's vocabulary (0..{tok.vocab - 1})",
    ]
    got = rows(store, "SELECT k.prompt, u.text, t.reward, t.correct, p.prompt_ids, p.response_ids "
                      "FROM trajectories t JOIN tasks k ON k.id = t.task_id JOIN token_payloads p ON p.trajectory_id = t.id "
                      "JOIN turns u ON u.trajectory_id = t.id AND u.role = 'assistant' ORDER BY t.id")
    assert [(p, c, r, ok) for p, c, r, ok, _, _ in got] == [
        ("What is 2+2?", "4", 1.0, True), ("What is 1+1?", "3", 0.0, False), ("What is 2+2?", "four", None, None)]
    p_ids, c_ids = got[0][4], got[0][5]
    assert list(p_ids) == tok.prompt_ids([{"role": "user", "content": "What is 2+2?"}])
    assert list(c_ids) == tok.completion_ids("4") and c_ids[-1] == tok.end
    # rows of one prompt share a task: 2 tasks
    assert rows(store, "SELECT count(*) FROM tasks WHERE run_id = :r", r=run) == [(2,)]


def test_a_prompts_consecutive_rows_stay_one_group_across_batches(store, tmp_path, tok, monkeypatch):
    """Rollout files hold a prompt's G completions on consecutive lines: each prompt is one group
    (its rewards are each other's baseline when trained), whatever the batch size; only a prompt
    with more than MAX_GROUP_ROWS consecutive rows is split. A second import of the file writes
    nothing, with the same batch size or another, and says how many rows it had already."""
    from reflexdb.ops import importer

    lines = [{"prompt": p, "completion": str(j), "reward": j / 4} for p, n in (("A", 4), ("B", 4), ("C", 2))
             for j in range(n)]
    lines += [{"prompt": "D", "completion": str(j), "reward": 0.0} for j in range(7)]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = store.create_run("imported-groups")
    sizes_sql = "SELECT k.prompt, g.size FROM groups g JOIN tasks k ON k.id = g.task_id WHERE g.run_id = :r ORDER BY g.id"
    for batch_size, (imported, already) in ((3, (17, 0)), (3, (0, 17)), (5, (0, 17)), (500, (0, 17))):
        stats = import_file(store, run, path, tok, batch_size=batch_size)
        assert (stats.rows, stats.imported, stats.already, stats.bad) == (17, imported, already, []), batch_size
        # Batches of 3: A A A (one prompt: carried) | A B B (A A A A written, B B carried) | B B C |
        # C D D | D D D | D D: D's 7 rows are carried to the end, one group.
        assert rows(store, sizes_sql, r=run) == [("A", 4), ("B", 4), ("C", 2), ("D", 7)]
    # A run of one prompt longer than a group may hold is split (here at 5 rows, in batches of 3)
    monkeypatch.setattr(importer, "MAX_GROUP_ROWS", 4)
    other = store.create_run("imported-split")
    assert import_file(store, other, path, tok, batch_size=3).imported == 17
    assert rows(store, sizes_sql, r=other) == [("A", 4), ("B", 4), ("C", 2), ("D", 5), ("D", 2)]


def test_unreadable_files_are_refused(store, tmp_path, tok):
    run = store.create_run("imported")
    with pytest.raises(ImportFailed, match="does not exist"):
        import_file(store, run, tmp_path / "missing.jsonl", tok)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ImportFailed, match="use .jsonl or .parquet"):
        import_file(store, run, tmp_path / "x.csv", tok)
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(ImportFailed, match="is not a Parquet file"):
        import_file(store, run, tmp_path / "x.parquet", tok)
