"""Migrations: up and down, idempotent, and a migrated database equals the declared metadata."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from reflexdb import migrate, schema
from reflexdb.db import make_engine
from reflexdb.migrations.sqlfiles import view_sql


def _diff(engine):
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), schema.metadata)


def test_upgrade_creates_declared_schema(empty_db_url):
    engine = make_engine(empty_db_url)
    migrate.upgrade(engine)
    assert _diff(engine) == []
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        views = set(inspect(conn).get_view_names())
    assert set(schema.VIEWS) <= views
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
        assert migrate.current_revision(conn) is None
    migrate.upgrade(engine)
    assert _diff(engine) == []
    engine.dispose()


def test_views_match_their_sql_files(db_url):
    """The views in a migrated database are the ones the .sql files define."""
    engine = make_engine(db_url)
    with engine.connect() as conn:  # never committed: the copies vanish with the rollback
        for name in schema.VIEWS:
            migrated = conn.execute(text("SELECT pg_get_viewdef(CAST(:v AS regclass))"), {"v": name}).scalar()
            sql = view_sql(name).replace(f"CREATE OR REPLACE VIEW {name} AS", f"CREATE VIEW {name}_from_file AS")
            conn.execute(text(sql))
            from_file = conn.execute(
                text("SELECT pg_get_viewdef(CAST(:v AS regclass))"), {"v": f"{name}_from_file"}
            ).scalar()
            assert migrated == from_file, name
    engine.dispose()


def test_every_view_file_has_a_header():
    for name in schema.VIEWS:
        sql = view_sql(name)
        header = [line for line in sql.splitlines() if line.startswith("--")]
        assert header[0].startswith(f"-- {name}:"), name
        assert any("Settings read:" in line for line in header), name
