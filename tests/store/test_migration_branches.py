"""A method's own migration branch (reflexdb/migrate.py): its folder registered in
``reflexdb.plugins.MIGRATIONS``, its first revision depending on a core revision; the code's head is
every branch's head, ``reflexdb db upgrade`` adds the branch to a database made before it was
installed, and the store refuses a database that lacks it."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from reflexdb import Store, migrate
from reflexdb.db import make_engine
from reflexdb.errors import SchemaOutdated
from reflexdb.plugins import MIGRATIONS

REVISION = '''"""A test method's schema: its origin and a table.

Revision ID: testbranch_0001
Revises:
Create Date: 2026-11-26
"""

from alembic import op

revision = "testbranch_0001"
down_revision = None
branch_labels = ("testbranch",)
depends_on = "0018"


def upgrade() -> None:
    op.execute("INSERT INTO origins VALUES ('checked', 'stored', false, true, 'testbranch', 'a test origin')")
    op.execute("CREATE TABLE testbranch_notes (id bigint PRIMARY KEY, note text NOT NULL)")


def downgrade() -> None:
    op.execute("DROP TABLE testbranch_notes")
    op.execute("DELETE FROM origins WHERE name = 'checked'")
'''


#: The head without the test's branch: reflexdb's chain and the built-in methods' branches.
BUILT_IN = "0029, lte_0004, r3l_0002"


@pytest.fixture
def branch(tmp_path, monkeypatch):
    folder = tmp_path / "testbranch_versions"
    folder.mkdir()
    (folder / "testbranch_0001.py").write_text(REVISION)
    MIGRATIONS.names()  # the installed plug-ins loaded first; then the test's branch on a copy of the registry
    monkeypatch.setattr(MIGRATIONS, "_items", {**MIGRATIONS._items, "testbranch": folder})
    return folder


def test_a_branch_is_upgraded_with_the_core_and_named_in_the_head(branch, empty_db_url):
    assert migrate.head_revision() == f"{BUILT_IN}, testbranch_0001"
    engine = make_engine(empty_db_url)
    try:
        migrate.upgrade(engine)  # an empty database: the core first (depends_on), then the branch
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == f"{BUILT_IN}, testbranch_0001"
            assert conn.execute(text("SELECT method FROM origins WHERE name = 'checked'")).scalar() == "testbranch"
        migrate.check_current(engine)
        migrate.downgrade(engine, "testbranch@base")  # the branch alone goes
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == BUILT_IN
            assert conn.execute(text("SELECT to_regclass('testbranch_notes')")).scalar() is None
    finally:
        engine.dispose()


def test_upgrade_adds_a_branch_to_a_database_made_before_it(db_url, tmp_path, monkeypatch):
    engine = make_engine(db_url)  # made at the core's head, with no branch installed
    try:
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == BUILT_IN
        folder = tmp_path / "v"
        folder.mkdir()
        (folder / "testbranch_0001.py").write_text(REVISION)
        MIGRATIONS.names()
        monkeypatch.setattr(MIGRATIONS, "_items", {**MIGRATIONS._items, "testbranch": folder})
        with pytest.raises(SchemaOutdated, match=rf"at revision {BUILT_IN} but this code needs {BUILT_IN}, testbranch_0001: "
                                                 r"run `reflexdb db upgrade`"):
            Store.open(db_url)
        migrate.upgrade(engine)
        Store.open(db_url).engine.dispose()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM testbranch_notes")).scalar() == 0
        # code without the branch refuses the database the branch wrote, naming the revision
        monkeypatch.setattr(MIGRATIONS, "_items", {k: v for k, v in MIGRATIONS._items.items() if k != "testbranch"})
        with pytest.raises(SchemaOutdated, match=r"revision testbranch_0001 of migration branch testbranch, which no "
                                                 r"installed package provides: reinstall the package"):
            migrate.check_current(engine)
    finally:
        engine.dispose()
