"""The SQL files under benchmarks/ (docs/experiments.md runs them with ``reflexdb sql "$(grep -v '^--'
FILE)" -v names=...``) still parse and name real tables, views and columns: each runs on a store
with runs of those names and no episodes, and returns its columns and no rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from reflexdb.ops.psqlvars import substitute, variables
from tests.factories import setup_run

QUERIES = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.sql"))


def test_there_are_benchmark_queries():
    assert {q.name for q in QUERIES} >= {"cleaner_mechanism.sql", "first_call_failures.sql"}


@pytest.mark.parametrize("path", QUERIES, ids=lambda p: p.name)
def test_a_benchmark_query_runs_on_the_schema(store, path):
    lines = path.read_text().splitlines()
    assert lines[0].startswith("--") and any("reflexdb sql" in ln for ln in lines if ln.startswith("--")), \
        f"{path.name}: start with comments saying what it reports and how to run it"
    sql = "\n".join(ln for ln in lines if not ln.startswith("--"))  # as the documented grep -v does
    assert variables(sql) == {"names"}
    setup_run(store, "dapo-s9")
    setup_run(store, "cleaner-s9")
    with store.engine.begin() as conn:
        res = conn.execute(text(substitute(sql, {"names": "dapo-s9,cleaner-s9"})))
        assert list(res.keys()) and res.fetchall() == []
