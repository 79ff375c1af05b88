"""A database made by a release upgrades in place: every row intact, every view answering.

``tests/data/release-0017.sql.gz`` is a plain pg_dump of a database made by the release before the
restructuring of issue 35 (schema revision 0017), holding rows of every origin: the cookbook's data
(plain groups, evals, a NexGRPO replay, a guided retry, R3L's reflections, retries and distilled
twins, CLEANER's raw and purified episodes with their rollbacks, learner steps, collectors), an LTE
hinted group and imported rows. The test restores it into an empty database with psql, reads every
table, runs ``migrate.upgrade`` and reads them again.

To make the dump again (only for a new release's dump: a landed dump is never rewritten), against
the PostgreSQL 15 server so that older servers can restore it too::

    REFLEXDB_TEST_URL=postgresql://127.0.0.1:5432/test REFLEXDB_WRITE_DUMP=tests/data/release-NNNN.sql.gz \\
        pytest tests/store/test_release_upgrade.py -k write -p no:xdist
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from reflexdb import migrate, schema
from reflexdb.db import libpq_url, make_engine
from tests.store.test_cookbook import _psql, data  # noqa: F401  (data: the cookbook's populated run, a fixture)

DUMP = Path(__file__).resolve().parents[1] / "data" / "release-0017.sql.gz"
#: Every origin a trajectory of the 0017 release could have (reflexdb/origins.py at that release).
RELEASE_ORIGINS = {"base", "distilled", "guided_retry", "hinted", "imported", "purified", "raw", "reflection",
                   "replayed"}


def _lte_hinted(store) -> None:
    """A none-pass group of a run of its own, its hint stage claimed and an LTE group written."""
    from reflexdb.methods.lte import stages as lte
    from tests.methods.lte.store.test_lte import _lte_group, _stage_setup

    run, _, _, _ = _stage_setup(store)
    [stage] = lte.claim_stages(store, run, "a", 5, min_version=0, timeout_s=300)
    _, group = _lte_group(store, stage, 2)
    store.write_group(group, complete_claim="a")


def _imported(store, tmp_path, model_cache) -> None:
    from reflexdb.ops.importer import Tokenizer, import_file
    from reflexdb.models import resolve_model

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"prompt": "What is 2+2?", "completion": "4", "reward": 1.0},
        {"prompt": "What is 2+2?", "completion": "5", "reward": 0.0})))
    import_file(store, store.create_run("imported"), path, Tokenizer(resolve_model("tiny")))


@pytest.mark.skipif(not os.environ.get("REFLEXDB_WRITE_DUMP"), reason="writes a release dump (module docstring)")
def test_write_release_dump(store, db_url, data, tmp_path, model_cache):  # noqa: F811
    _lte_hinted(store)
    _imported(store, tmp_path, model_cache)
    with store.engine.connect() as conn:
        origins = {o for (o,) in conn.execute(text("SELECT DISTINCT origin FROM trajectories"))}
    assert origins == RELEASE_ORIGINS
    pg_dump = shutil.which("pg_dump")
    out = subprocess.run([pg_dump, "--no-owner", "--no-privileges", "--format=plain", libpq_url(db_url)],
                         capture_output=True, check=True).stdout
    target = Path(os.environ["REFLEXDB_WRITE_DUMP"])
    target.write_bytes(gzip.compress(out, mtime=0))


def _restore(url: str) -> None:
    sql = gzip.decompress(DUMP.read_bytes()).decode()
    sql = re.sub(r"^SET transaction_timeout = 0;$", "", sql, flags=re.M)  # a setting of servers >= 17 only
    done = subprocess.run([_psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", libpq_url(url)], input=sql,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


#: Columns a later revision moved into a method's own table: (table, column) -> the expression that
#: reads the value where it lives now (R3L's r3l_0001 and LTE's lte_0001 links).
MOVED = {
    ("trajectories", "reflection_id"): "(SELECT l.reflection_id FROM trajectory_reflections l "
                                       "WHERE l.trajectory_id = trajectories.id AND l.run_id = trajectories.run_id)",
    ("trajectories", "hint_id"): "(SELECT l.hint_id FROM trajectory_hints l "
                                 "WHERE l.trajectory_id = trajectories.id AND l.run_id = trajectories.run_id)",
}


def _tables(engine, columns: dict[str, list[str]] | None = None) -> dict[str, tuple[list[str], list[str]]]:
    """Every declared table's columns and rows (each row the repr of its values, sorted); with
    ``columns``, those tables and columns only (the release's, read after an upgrade: a column that
    moved is read where it lives now, :data:`MOVED`)."""
    out = {}
    insp = inspect(engine)
    names = sorted(columns) if columns else [n for n in sorted(insp.get_table_names())
                                             if not re.search(r"_r\d+$", n) and n != "alembic_version"]
    with engine.connect() as conn:
        for name in names:  # a run's partitions (<table>_r<id>) are read through their parent
            cols = columns[name] if columns else [c["name"] for c in insp.get_columns(name)]
            exprs = [MOVED.get((name, c), f'"{c}"') if columns else f'"{c}"' for c in cols]
            got = conn.execute(text(f"SELECT {', '.join(exprs)} FROM {name}")).all()
            out[name] = (cols, sorted(repr(tuple(r)) for r in got))
    return out


def test_a_release_database_upgrades_in_place(empty_db_url):
    _restore(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == "0017"
            origins = {o for (o,) in conn.execute(text("SELECT DISTINCT origin FROM trajectories"))}
        assert origins == RELEASE_ORIGINS
        before = _tables(engine)
        assert sum(len(rows) for _, rows in before.values()) > 200
        with engine.connect() as conn:  # the dump holds values of the columns that move
            assert conn.execute(text("SELECT count(reflection_id), count(hint_id) FROM trajectories")).one() >= (3, 1)
        migrate.upgrade(engine)
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == migrate.head_revision()
        after = _tables(engine, {name: cols for name, (cols, _) in before.items()})
        changed = [name for name in before if after[name][1] != before[name][1]]
        assert changed == [], "rows of the release changed by the upgrade"
        with engine.connect() as conn:  # every view answers
            for view in schema.views():
                conn.execute(text(f"SELECT * FROM {view} LIMIT 5")).all()
    finally:
        engine.dispose()


def test_the_dump_is_the_release_s():
    """The dump is landed data: its bytes are pinned like a landed migration's (migrations/MANIFEST.json)."""
    import hashlib

    assert DUMP.exists()
    digest = hashlib.sha256(DUMP.read_bytes()).hexdigest()
    assert digest == (DUMP.parent / (DUMP.name + ".sha256")).read_text().split()[0]
