"""reflexdb export: views and queries to Parquet and JSONL, streamed, with trajectory texts and tokens."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from reflexdb import GroupIn, TurnIn
from reflexdb.ops.export import ExportError, export
from tests.factories import make_trajectory, setup_run
from tests.processes import rows


def _fill(store):
    """3 tasks x groups of 4 (1 correct each), distinct texts and tokens."""
    rng = np.random.default_rng(0)
    run, tasks = setup_run(store, n_tasks=3)
    for k, task in enumerate(tasks):
        trajs = []
        for j in range(4):
            ok = j == 0
            trajs.append(make_trajectory(rng, T=5 + j, P=4, dim=None, reward=float(ok), correct=ok,
                                         text=f"answer {k}.{j}",
                                         turns=[TurnIn("user", f"What is {k}+3?"), TurnIn("assistant", f"answer {k}.{j}", 0, 5 + j)]))
        store.write_group(GroupIn(run_id=run, task_id=task, policy_version=0, trajectories=trajs))
    return run


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_runs_failures_round_trip_with_texts_and_tokens(store, db_url, tmp_path, suffix):
    run = _fill(store)
    out = tmp_path / f"failures{suffix}"
    stats = export(db_url, "failures", out, batch_size=2)  # 9 rows in 5 batches
    assert (stats.rows, stats.batches) == (9, 5)
    got = pq.read_table(out).to_pylist() if suffix == ".parquet" else \
        [json.loads(line) for line in out.read_text().splitlines()]
    want = {tid: (list(map(int, p)), list(map(int, r)), text) for tid, p, r, text in rows(
        store, "SELECT t.id, p.prompt_ids, p.response_ids, u.text FROM trajectories t "
               "JOIN token_payloads p ON p.trajectory_id = t.id "
               "JOIN turns u ON u.trajectory_id = t.id AND u.role = 'assistant' WHERE NOT t.correct")}
    assert len(got) == 9 and {r["trajectory_id"] for r in got} == set(want)
    for r in got:
        p, c, text = want[r["trajectory_id"]]
        assert (r["prompt_ids"], r["completion_ids"], r["completion"]) == (p, c, text)
        assert r["prompt"].startswith("What is") and len(r["logprobs"]) == len(c)
        assert r["run_id"] == run and r["reward"] == 0.0


def test_chat_rows_carry_messages_and_plain_queries_keep_their_types(store, db_url, tmp_path):
    _fill(store)
    out = tmp_path / "chat.parquet"
    export(db_url, "SELECT id AS trajectory_id, reward, correct, meta, created_at FROM trajectories ORDER BY id LIMIT 2",
           out, chat=True)
    t = pq.read_table(out)
    assert [m["role"] for m in t.column("messages").to_pylist()[0]] == ["user", "assistant"]
    assert str(t.schema.field("correct").type) == "bool" and str(t.schema.field("reward").type) == "double"
    assert str(t.schema.field("created_at").type).startswith("timestamp")
    assert json.loads(t.column("meta").to_pylist()[0]) == {}
    plain = tmp_path / "plain.parquet"
    export(db_url, "SELECT 1 AS one, ARRAY[1,2] AS xs, NULL::text AS nothing WHERE false", plain)
    assert pq.read_table(plain).num_rows == 0 and pq.read_table(plain).schema.names == ["one", "xs", "nothing"]


def test_best_trajectory_per_task_loads_with_datasets_as_an_sft_set(store, db_url, tmp_path):
    datasets = pytest.importorskip("datasets")
    _fill(store)
    out = tmp_path / "sft.parquet"
    export(db_url, "SELECT DISTINCT ON (task_id) id AS trajectory_id, task_id, reward FROM trajectories "
                   "ORDER BY task_id, reward DESC, id", out, chat=True)
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert len(ds) == 3 and set(ds.column_names) >= {"messages", "prompt_ids", "completion_ids", "logprobs"}
    assert all(m[-1]["content"].endswith(".0") for m in ds["messages"])  # answer k.0: the correct one


def test_bad_sources_and_paths_are_refused_and_leave_nothing(store, db_url, tmp_path):
    with pytest.raises(ExportError, match="neither a view or table name nor a query"):
        export(db_url, "failures; DROP TABLE runs", tmp_path / "x.parquet")
    with pytest.raises(ExportError, match="use .parquet, .jsonl or .csv"):
        export(db_url, "failures", tmp_path / "x.xlsx")
    with pytest.raises(ExportError, match="does not exist"):
        export(db_url, "failures", tmp_path / "nope" / "x.jsonl")
    with pytest.raises(ExportError, match='relation "no_such_view" does not exist'):
        export(db_url, "no_such_view", tmp_path / "x.jsonl")
    with pytest.raises(ExportError, match="data-modifying"):  # a cursor refuses it; the transaction is read-only too
        export(db_url, "WITH d AS (DELETE FROM runs RETURNING id) SELECT * FROM d", tmp_path / "x.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_csv_cells_a_spreadsheet_would_run_get_a_quote_first(store, db_url, tmp_path):
    import csv

    from reflexdb.ops.export import csv_cell

    assert [csv_cell(v) for v in ("=1+1", "+1", "-5", "@SUM(A1)", "\tx", "\rx", "plain", "a=b")] == \
        ["'=1+1", "'+1", "'-5", "'@SUM(A1)", "'\tx", "'\rx", "plain", "a=b"]
    assert [csv_cell(v) for v in (None, True, -0.5, -3, [1, 2], {"a": "=x"})] == \
        ["", "true", "-0.5", "-3", "[1, 2]", '{"a": "=x"}']  # numbers stay numbers; JSON starts with [ or {
    _fill(store)
    out = tmp_path / "rows.csv"
    stats = export(db_url, "SELECT id AS trajectory_id, reward, '=HYPERLINK(\"http://x/\")' AS note, "
                           "ARRAY[-1, 2] AS xs FROM trajectories ORDER BY id", out, batch_size=5)
    with out.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert stats.rows == len(rows) == 12 and "prompt_ids" in rows[0]
    assert rows[0]["note"] == "'=HYPERLINK(\"http://x/\")" and rows[0]["xs"] == "[-1, 2]"
    assert rows[0]["completion"] == "answer 0.0" and rows[0]["reward"] == "1.0"
