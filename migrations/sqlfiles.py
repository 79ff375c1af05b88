"""Create and drop the versioned SQL views from migrations.

A view's current definition lives in ``reflexdb/sql/views/<name>.sql``. When a later revision
changes a view, the definition the older revision created is first copied to
``reflexdb/sql/views/history/<name>.<revision>.sql`` and that older revision passes
``version=<revision>``, so every revision keeps creating exactly what it created the day it was
written (upgrade and downgrade stay reproducible). See docs/design.md.
"""

from __future__ import annotations

from importlib import resources

from alembic import op


def view_sql(name: str, version: str | None = None) -> str:
    """The ``CREATE VIEW`` text of view ``name`` (its current file, or a historical version)."""
    views = resources.files("reflexdb") / "sql" / "views"
    path = views / "history" / f"{name}.{version}.sql" if version else views / f"{name}.sql"
    return path.read_text()


def create_views(names, version: str | None = None) -> None:
    for name in names:
        op.execute(view_sql(name, version))


def drop_views(names) -> None:
    for name in reversed(tuple(names)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
