"""Create and drop the versioned SQL views and functions from migrations.

A view's current definition lives in ``reflexdb/sql/views/<name>.sql``. When a later revision
changes a view, the definition the older revision created is first copied to
``reflexdb/sql/views/history/<name>.<revision>.sql`` and that older revision passes
``version=<revision>``, so every revision keeps creating exactly what it created the day it was
written (upgrade and downgrade stay reproducible). See docs/design.md.

SQL functions the views call live in ``reflexdb/sql/functions/<name>.sql`` (one
``CREATE OR REPLACE FUNCTION`` each) and are versioned the same way, under
``reflexdb/sql/functions/history/``.
"""

from __future__ import annotations

from importlib import resources

from alembic import op


def _sql_file(kind: str, name: str, version: str | None) -> str:
    folder = resources.files("reflexdb") / "sql" / kind
    path = folder / "history" / f"{name}.{version}.sql" if version else folder / f"{name}.sql"
    return path.read_text()


def view_sql(name: str, version: str | None = None) -> str:
    """The ``CREATE VIEW`` text of view ``name`` (its current file, or a historical version)."""
    return _sql_file("views", name, version)


def function_sql(name: str, version: str | None = None) -> str:
    """The ``CREATE FUNCTION`` text of SQL function ``name`` (its current file, or a historical version)."""
    return _sql_file("functions", name, version)


def create_views(names, version: str | None = None) -> None:
    for name in names:
        op.execute(view_sql(name, version))


def drop_views(names) -> None:
    for name in reversed(tuple(names)):
        op.execute(f"DROP VIEW IF EXISTS {name}")


def create_functions(names, version: str | None = None) -> None:
    for name in names:
        op.execute(function_sql(name, version))


def drop_functions(signatures) -> None:
    """Drop functions given with their argument types, e.g. ``run_setting(bigint, text, text)``."""
    for signature in reversed(tuple(signatures)):
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
