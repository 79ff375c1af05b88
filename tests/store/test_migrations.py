"""Migrations: up and down, idempotent, and a migrated database equals the declared metadata."""

from __future__ import annotations

import re

import numpy as np
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from reflexdb.migrations.sqlfiles import function_sql, view_sql
from sqlalchemy import inspect, text

from reflexdb import migrate, schema
from reflexdb.db import make_engine
from tests.factories import make_group, setup_run

_PARTITION = re.compile(rf"({'|'.join(schema.PARTITIONED)})_r\d+")


def _not_a_partition(name, type_, parent_names) -> bool:
    """Runs' partitions (<table>_r<id>, created by create_run_partitions) are not declared tables."""
    return not (type_ == "table" and _PARTITION.fullmatch(name or ""))


def _not_of_a_partition(obj, name, type_, reflected, compare_to) -> bool:
    """PostgreSQL gives a foreign key to a partitioned table one more constraint per partition."""
    return not (type_ == "foreign_key_constraint" and _PARTITION.fullmatch(obj.referred_table.name))


def _diff(engine):
    with engine.connect() as conn:
        opts = {"include_name": _not_a_partition, "include_object": _not_of_a_partition}
        return compare_metadata(MigrationContext.configure(conn, opts=opts), schema.full_metadata())


def _functions(conn) -> set[str]:
    """Names of the functions in schema public."""
    return set(conn.execute(text(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
    )).scalars())


def test_upgrade_creates_declared_schema(empty_db_url):
    engine = make_engine(empty_db_url)
    migrate.upgrade(engine)
    assert _diff(engine) == []
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        views = set(inspect(conn).get_view_names())
        functions = _functions(conn)
    assert set(schema.views()) <= views
    assert set(schema.FUNCTIONS) <= functions
    engine.dispose()


def test_upgrade_is_idempotent(db_url):
    engine = make_engine(db_url)
    migrate.upgrade(engine)
    migrate.upgrade(engine)
    assert _diff(engine) == []
    engine.dispose()


def test_downgrade_to_base_and_up_again(db_url):
    engine = make_engine(db_url)
    migrate.downgrade(engine, "base")
    with engine.connect() as conn:
        left = set(inspect(conn).get_table_names()) - {"alembic_version"}
        assert left == set()
        assert inspect(conn).get_view_names() == []
        assert _functions(conn) == set()
        assert migrate.current_revision(conn) is None
    migrate.upgrade(engine)
    assert _diff(engine) == []
    engine.dispose()


def test_views_match_their_sql_files(db_url):
    """The views in a migrated database are the ones the .sql files define."""
    engine = make_engine(db_url)
    with engine.connect() as conn:  # never committed: the copies vanish with the rollback
        for name in schema.views():
            migrated = conn.execute(text("SELECT pg_get_viewdef(CAST(:v AS regclass))"), {"v": name}).scalar()
            sql = view_sql(name).replace(f"CREATE OR REPLACE VIEW {name} AS", f"CREATE VIEW {name}_from_file AS")
            conn.execute(text(sql))
            from_file = conn.execute(
                text("SELECT pg_get_viewdef(CAST(:v AS regclass))"), {"v": f"{name}_from_file"}
            ).scalar()
            assert migrated == from_file, name
    engine.dispose()


def test_every_view_file_has_a_header():
    for name in schema.views():
        sql = view_sql(name)
        header = [line for line in sql.splitlines() if line.startswith("--")]
        assert header[0].startswith(f"-- {name}:"), name
        assert any("Settings read:" in line for line in header), name


def test_functions_match_their_sql_files(db_url):
    """Each migrated SQL function has the body, arguments and volatility its .sql file declares."""
    engine = make_engine(db_url)
    with engine.connect() as conn:
        for name in schema.FUNCTIONS:
            sql = function_sql(name)
            assert sql.startswith(f"-- {name}:"), name
            body = re.search(r"\$\$(.*)\$\$", sql, re.DOTALL).group(1)
            src, args, volatile, parallel = conn.execute(text(
                "SELECT prosrc, pg_get_function_arguments(oid), provolatile, proparallel FROM pg_proc "
                "WHERE proname = :n"), {"n": name}).one()
            assert src == body, name
            declared = re.search(r"LANGUAGE \w+ (IMMUTABLE|STABLE|VOLATILE)(?: STRICT)? PARALLEL (SAFE|UNSAFE)", sql)
            assert args in sql and volatile == declared.group(1)[0].lower(), name
            assert parallel == declared.group(2)[0].lower(), name
    engine.dispose()


# Views migration 0006 rewrote to call run_setting(), with the revision whose definition they had.
REWRITTEN_BY_0006 = {"learner_eligible": "0003", "nexgrpo_negative_pool": "0004",
                     "nexgrpo_replay_candidates": "0004", "untrained_groups": "0005"}


def _view_rows(engine) -> dict[str, list[tuple]]:
    with engine.connect() as conn:
        return {v: sorted((tuple(r) for r in conn.execute(text(f"SELECT * FROM {v}"))), key=repr)
                for v in REWRITTEN_BY_0006}


def test_0006_run_setting_leaves_view_outputs_unchanged(store, db_url):
    """The views read settings through run_setting() with the same results as their subqueries did.

    Two runs: one with every setting the views read (non-default values), one with none (the
    defaults) but a JSON null, which reads as the default too. Downgrading to 0005 restores the
    historical definitions exactly and drops the function; upgrading again gives the same rows.
    """
    rng = np.random.default_rng(3)
    with_settings, tasks_a = setup_run(store, "settings", n_tasks=4)
    defaults, tasks_b = setup_run(store, "defaults", n_tasks=4)
    store.set_settings(with_settings, {"learner.max_staleness": 2, "learner.max_reuse": 2,
                                       "nexgrpo.conf_low": 0.3, "nexgrpo.conf_high": 0.75,
                                       "nexgrpo.difficulty_sd": 0.5})
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO run_settings (run_id, key, value) VALUES (:r, 'nexgrpo.conf_low', 'null')"),
                     {"r": defaults})
    for run, tasks in ((with_settings, tasks_a), (defaults, tasks_b)):
        written = []
        for version in range(4):
            for i, task in enumerate(tasks):
                # Confidences exp(mean log p) spread over [0.1, 0.95], so both gates cut somewhere.
                conf = 0.1 + 0.85 * ((version * 4 + i) % 7) / 6
                logprobs = np.full(50, np.log(conf), np.float32)
                written.append(store.write_group(make_group(rng, run, task, size=4, version=version,
                                                            n_correct=(i + version) % 5, logprobs=logprobs)))
            store.publish_policy(run, version, f"file:///{run}/v{version}")
            with store.engine.connect() as conn:
                snapshot = conn.execute(text("SELECT pg_current_snapshot()::text")).scalar()
            store.record_step(run, version + 1, version, written[-2].trajectory_ids[:2] + written[0].trajectory_ids[:1],
                              batch_snapshot=snapshot)
    engine = make_engine(db_url)
    at_head = _view_rows(engine)
    assert all(at_head.values())  # every view has rows to compare
    gates = {r[0]: r[8:10] for r in at_head["nexgrpo_negative_pool"]}
    assert gates == {with_settings: (0.3, 0.75), defaults: (0.2, 0.9)}

    migrate.downgrade(engine, "0005")
    with engine.connect() as conn:
        assert "run_setting" not in _functions(conn)
        for name, version in REWRITTEN_BY_0006.items():
            migrated = conn.execute(text("SELECT pg_get_viewdef(CAST(:v AS regclass))"), {"v": name}).scalar()
            old = view_sql(name, version).replace(f"CREATE OR REPLACE VIEW {name} AS",
                                                  f"CREATE VIEW {name}_from_file AS")
            conn.execute(text(old))
            assert migrated == conn.execute(text("SELECT pg_get_viewdef(CAST(:v AS regclass))"),
                                            {"v": f"{name}_from_file"}).scalar(), name
        conn.rollback()
    assert _view_rows(engine) == at_head

    migrate.upgrade(engine)
    assert _view_rows(engine) == at_head
    assert _diff(engine) == []
    engine.dispose()
