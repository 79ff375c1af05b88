"""Create and drop the versioned SQL views and functions from migrations.

A view's current definition lives in ``reflexdb/sql/views/<name>.sql``, or, for a view a method
owns, in its package's ``sql/views/<name>.sql`` (found by name: ``reflexdb.sqlfile.find``). When a
later revision changes a view, the definition the older revision created is first copied to
``history/<name>.<revision>.sql`` beside it, so every revision keeps creating exactly
what it created the day it was written (upgrade and downgrade stay reproducible). The older
revision's file is never edited (migrations/MANIFEST.json holds each landed file's hash): an
``upgrade()`` that names no ``version`` reads its own revision's copy when one exists
(:func:`_calling_revision`), and the current file otherwise. Revisions written before this rule
pass ``version=<revision>`` themselves. See docs/design.md.

SQL functions the views call live in ``reflexdb/sql/functions/<name>.sql`` (one
``CREATE OR REPLACE FUNCTION`` each) and are versioned the same way, under
``reflexdb/sql/functions/history/``.
"""

from __future__ import annotations

import sys

from alembic import op

from reflexdb.sqlfile import find


def _calling_revision() -> str | None:
    """The revision whose ``upgrade()`` called us (a migration module's ``revision`` global), if any."""
    frame = sys._getframe(2)
    while frame is not None:
        g = frame.f_globals
        if frame.f_code.co_name == "upgrade" and "revision" in g and "down_revision" in g:
            return g["revision"]
        frame = frame.f_back
    return None


def _sql_file(kind: str, name: str, version: str | None) -> str:
    """The file's text, found by name in reflexdb's SQL folder or a method package's
    (``reflexdb.sqlfile.find``: a view keeps its name when its file moves into the package that owns it)."""
    if version is None:  # a revision's own pinned copy, once a later revision changed the file
        rev = _calling_revision()
        pinned = find(f"{kind}/history", f"{name}.{rev}.sql", missing_ok=True) if rev else None
        if pinned is not None:
            return pinned.read_text()
    path = find(f"{kind}/history", f"{name}.{version}.sql") if version else find(kind, f"{name}.sql")
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
