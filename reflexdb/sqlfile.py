"""SQL files: named query blocks, and the folders that hold view and function definitions.

reflexdb's own SQL lives in ``reflexdb/sql/``; a method package keeps its own in ``<package>/sql/``
(views in ``views/``, their pinned copies in ``views/history/``, query files, and ``roles.sql``)
and registers that folder in ``reflexdb.plugins.SQL`` (docs/design.md, "Adding a method").
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path

_NAME = re.compile(r"^-- name: *(\w+) *$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Map each ``-- name: x`` block of ``text`` to its SQL (procrastinate's ``-- name:`` convention)."""
    parts = _NAME.split(text)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        sql = "\n".join(line for line in body.strip().splitlines() if not line.startswith("--")).strip()
        queries[name] = sql.rstrip(";")
    return queries


@cache
def load_queries(filename: str = "queries.sql", package: str = "reflexdb") -> dict[str, str]:
    """Map each ``-- name: x`` block of ``<package>/sql/<filename>`` to its SQL text.

    A method package passes its own name (``load_queries("r3l.sql", __package__)``).
    """
    return parse_queries((resources.files(package) / "sql" / filename).read_text())


def folders() -> list[tuple[str, Path]]:
    """Every SQL folder, reflexdb's first, then each registered package's (``(owner, path)``)."""
    from .plugins import SQL

    return [("reflexdb", Path(str(resources.files("reflexdb") / "sql"))), *SQL.items()]


def find(kind: str, filename: str, missing_ok: bool = False) -> Path | None:
    """``<folder>/<kind>/<filename>`` in the one SQL folder that has it (``kind``: ``views``,
    ``functions``, ``views/history``, ...).

    Raises:
        FileNotFoundError: no folder has it (unless ``missing_ok``: None), or more than one does
            (names are global in the database).
    """
    found = [folder / kind / filename for _, folder in folders() if (folder / kind / filename).is_file()]
    if not found and missing_ok:
        return None
    if len(found) != 1:
        where = ", ".join(str(f) for f in found) or f"no SQL folder ({', '.join(o for o, _ in folders())})"
        raise FileNotFoundError(f"{kind}/{filename}: {'found in ' if found else ''}{where}")
    return found[0]


#: A relation's name as a method may give one: ``name`` or ``schema.name``, each a plain SQL identifier.
_RELATION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def relation_name_problem(name: object) -> str | None:
    """What is wrong with ``name`` as the name of a view or table a method declares (``None``: nothing)."""
    if not isinstance(name, str) or not _RELATION.match(name) or len(name) > 127:
        return f"{name!r} is not the name of a view or table (name or schema.name: letters, digits, '_')"
    return None


def relation(name: str | None, column: str):
    """``name`` (a view or table a method declares, ``schema.name`` allowed) as a quoted identifier to
    format into a query (``psycopg.sql``), or, for ``None``, an empty relation with one bigint
    ``column``: the query then reads as if the method had declared a view with no row."""
    from psycopg import sql

    if name is None:
        return sql.SQL("(SELECT NULL::bigint AS {} WHERE false)").format(sql.Identifier(column))
    problem = relation_name_problem(name)
    if problem:
        raise ValueError(problem)
    return sql.Identifier(*name.split("."))
