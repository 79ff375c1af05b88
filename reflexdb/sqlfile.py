"""Load named SQL blocks from ``reflexdb/sql/*.sql`` (procrastinate's ``-- name:`` convention)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: *(\w+) *$", re.MULTILINE)


@cache
def load_queries(filename: str = "queries.sql") -> dict[str, str]:
    """Map each ``-- name: x`` block of ``reflexdb/sql/<filename>`` to its SQL text."""
    text = (resources.files("reflexdb") / "sql" / filename).read_text()
    parts = _NAME.split(text)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        sql = "\n".join(line for line in body.strip().splitlines() if not line.startswith("--")).strip()
        queries[name] = sql.rstrip(";")
    return queries
