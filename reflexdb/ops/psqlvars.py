"""psql-style variables in SQL text, so the cookbook's queries paste into ``reflexdb sql -v`` as
they do into psql (``\\set`` / ``psql -v``).

As psql does: ``:'name'`` becomes the value as a quoted string literal, ``:"name"`` as a quoted
identifier, ``:name`` the value verbatim. ``::`` casts, string literals, quoted identifiers and
comments are left alone. Unlike psql, a variable that is not set is an error naming it (psql
leaves it in place and the query fails with a syntax error).
"""

from __future__ import annotations

import re

from ..errors import ReflexdbError

# A variable reference, or something to leave alone (a literal, a quoted identifier, a comment).
# ``::`` never matches: the first colon is followed by another, the second is preceded by one.
_TOKENS = re.compile(
    r"(?<!:):'(?P<quoted>[A-Za-z_]\w*)'"
    r"|(?<!:):\"(?P<ident>[A-Za-z_]\w*)\""
    r"|(?P<literal>'(?:[^']|'')*')"
    r"|(?P<identifier>\"(?:[^\"]|\"\")*\")"
    r"|(?P<comment>--[^\n]*|/\*.*?\*/)"
    r"|(?<![:\w]):(?P<plain>[A-Za-z_]\w*)",
    re.DOTALL,
)


def variables(sql: str) -> set[str]:
    """The names of the variables ``sql`` refers to."""
    return {m["quoted"] or m["ident"] or m["plain"] for m in _TOKENS.finditer(sql)
            if m["quoted"] or m["ident"] or m["plain"]}


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """``NAME=VALUE`` strings (``-v``) as a mapping; the value is taken as written."""
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_]\w*", name.strip()):
            raise ReflexdbError(f"-v {item!r}: expected NAME=VALUE, e.g. -v run=arithmetic-grpo")
        out[name.strip()] = value
    return out


def substitute(sql: str, values: dict[str, object]) -> str:
    """Replace the variables of ``sql`` by ``values``, as psql does.

    Raises:
        ReflexdbError: ``sql`` refers to a variable that ``values`` does not set.
    """
    missing = sorted(variables(sql) - set(values))
    if missing:
        raise ReflexdbError(f"the query uses {', '.join(':' + m for m in missing)}, which is not set: pass "
                            + " ".join(f"-v {m}=VALUE" for m in missing))

    def repl(m: re.Match) -> str:
        if m["quoted"]:
            return "'" + str(values[m["quoted"]]).replace("'", "''") + "'"
        if m["ident"]:
            return '"' + str(values[m["ident"]]).replace('"', '""') + '"'
        if m["plain"]:
            return str(values[m["plain"]])
        return m[0]

    return _TOKENS.sub(repl, sql)
