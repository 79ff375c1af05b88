"""Run sizes as `reflexdb db status` and `reflexdb runs` print them."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import make_group
from tests.processes import rows
from tests.store.test_partitions import _write  # noqa: F401
from tests.store.test_roles import roles  # noqa: F401  (the fixture)


def test_db_status_and_runs_list_show_each_runs_size(store, db_url, tmp_path):
    from tests.e2e.test_cli import run_cli

    a, _ = _write(store, "small")
    big, _ = _write(store, "bigger")
    rng = np.random.default_rng(9)
    task = rows(store, "SELECT id FROM tasks WHERE run_id = :r LIMIT 1", r=big)[0][0]
    for _ in range(5):
        store.write_group(make_group(rng, big, task, size=8, T=400))
    out = run_cli(["db", "status"], db_url, tmp_path).stdout
    lines = out[out.index("size per run"):].splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["bigger", "small"]  # largest first
    assert lines[1].split()[-2] == "12"  # trajectories
    [(exact,)] = rows(store, "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE c.relname "
                             "IN ('trajectories_r%s', 'turns_r%s', 'token_bytes_r%s', 'embeddings_r%s', "
                             "'consumption_r%s')" % ((a,) * 5))
    assert float(lines[1].split()[1]) == pytest.approx(float(exact) / 2**20, abs=0.06)
