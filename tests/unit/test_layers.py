"""Layers that hold, and shared modules that name no method (issue 35), as ratchets.

Two checks on the code as text (ast and tokenize; nothing is imported):

- **Imports go down only**: ``reflexdb`` (the store and what every process shares) imports nothing of
  ``reflexdb.collector``, ``reflexdb.trainer``, ``reflexdb.methods`` or ``reflexdb.cli``; the
  collector and the trainer import nothing of each other or above; a method's package and the CLI
  import nothing of each other. A deferred import inside a function counts too.
- **Shared modules name no method**: outside a method's package (``methods/<name>/``), no
  identifier or string literal names a method (comments and docstrings may: they explain).

A third reads reflexdb's own SQL the same way: it names no method and reads no method's table or view.

All hold exceptions that exist today (``KNOWN_IMPORTS``, ``KNOWN_NAMES``, ``KNOWN_SQL_LINES``), each to be removed by
the restructuring of issue 35. The tests fail on any new violation, and on an exception that is no
longer needed (so the lists only shrink).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"reflexdb": "reflexdb", "collector": "reflexdb.collector", "trainer": "reflexdb.trainer",
            "methods": "reflexdb.methods", "cli": "reflexdb.cli", "explorer": "reflexdb.explorer"}
#: A method's package (``methods/<name>``) stands on the collector and the trainer; the CLI beside it.
LEVEL = {"reflexdb": 0, "reflexdb.collector": 1, "reflexdb.trainer": 1, "reflexdb.methods": 2, "reflexdb.cli": 2,
         "reflexdb.explorer": 2}

#: Modules that belong to one method, still outside its package (``methods/<name>/``, which the
#: check skips as a whole): to move there.
METHOD_MODULES: set[str] = set()
METHOD_NAME = re.compile(r"(?<![a-z0-9])(nexgrpo|lte|r3l|cleaner|grpo_lambda|grpo-λ|raft|saar)(?![a-z0-9])", re.I)

#: Imports that go up or sideways today: ``{file: {module imported}}``.
KNOWN_IMPORTS: dict[str, set[str]] = {}
#: Method names in shared modules today: ``{file: how many}``.
KNOWN_NAMES: dict[str, int] = {}
#: Lines of reflexdb's own SQL (``reflexdb/sql``, pinned copies aside) that name a method or read a
#: method's table or view today: ``{file: how many lines}``.
KNOWN_SQL_LINES: dict[str, int] = {}


def _modules():
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield path, path.relative_to(ROOT).as_posix(), package, ".".join((package, *parts))


def _layer(module: str) -> str | None:
    for package in ("reflexdb.collector", "reflexdb.trainer", "reflexdb.methods", "reflexdb.cli", "reflexdb.explorer"):
        if module == package or module.startswith(package + "."):
            return package
    return "reflexdb" if module == "reflexdb" or module.startswith("reflexdb.") else None


def upward_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path, rel, package, name in _modules():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[:len(base) - node.level + (1 if is_package else 0)]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                else:
                    targets = [node.module or ""]
            else:
                continue
            for target in targets:
                layer = _layer(target)
                if layer is None:
                    continue
                if layer == package:
                    if package == "reflexdb.methods" and _method(target) not in (None, _method(name)):
                        found.setdefault(rel, set()).add(target)  # one method's package into another's
                    continue
                if LEVEL[layer] >= LEVEL[package]:  # up, or sideways between the collector and the trainer
                    found.setdefault(rel, set()).add(target)
    return found


def _method(module: str) -> str | None:
    """``nexgrpo`` for ``reflexdb.methods.nexgrpo.planner``; None for ``reflexdb.methods`` itself."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else None


def _docstring(tokens, i) -> bool:
    j = i - 1
    while j >= 0 and tokens[j].type in (tokenize.NL, tokenize.COMMENT):
        j -= 1
    k = i + 1
    while k < len(tokens) and tokens[k].type in (tokenize.NL, tokenize.COMMENT):
        k += 1
    starts = j < 0 or tokens[j].type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)
    return starts and tokens[k].type in (tokenize.NEWLINE, tokenize.ENDMARKER)


def method_names() -> dict[str, list[tuple[int, str]]]:
    """``{file: [(line, name)]}`` of method names in code (not comments, not docstrings) of shared modules."""
    kinds = {tokenize.NAME, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)}
    found: dict[str, list[tuple[int, str]]] = {}
    for path, rel, _, _ in _modules():
        if rel in METHOD_MODULES or rel.startswith("methods/"):  # a method's own package
            continue
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
        for i, tok in enumerate(tokens):
            if tok.type not in kinds or (tok.type == tokenize.STRING and _docstring(tokens, i)):
                continue
            found.setdefault(rel, []).extend((tok.start[0], m.group(0)) for m in METHOD_NAME.finditer(tok.string))
    return {rel: hits for rel, hits in found.items() if hits}


def test_imports_go_down_only():
    found = upward_imports()
    new = {f: sorted(m - KNOWN_IMPORTS.get(f, set())) for f, m in found.items() if m - KNOWN_IMPORTS.get(f, set())}
    assert not new, f"imports that go up or sideways between layers: {new}"
    gone = {f: sorted(m - found.get(f, set())) for f, m in KNOWN_IMPORTS.items() if m - found.get(f, set())}
    assert not gone, f"fixed, so remove them from KNOWN_IMPORTS: {gone}"


def test_shared_modules_name_no_method():
    found = method_names()
    more = {f: hits for f, hits in found.items() if len(hits) > KNOWN_NAMES.get(f, 0)}
    assert not more, "method names in shared modules (move the code into the method's own module): " + "; ".join(
        f"{f}: " + ", ".join(f"line {ln} {name!r}" for ln, name in hits) for f, hits in more.items())
    fewer = {f: (n, len(found.get(f, []))) for f, n in KNOWN_NAMES.items() if len(found.get(f, [])) < n}
    assert not fewer, f"fewer than KNOWN_NAMES allows, so lower it (allowed, found): {fewer}"


def method_objects() -> set[str]:
    """The tables and views the method packages own (their ``tables.py`` and ``sql/views/``)."""
    names = set()
    for path in (ROOT / "methods").glob("*/tables.py"):
        names |= set(re.findall(r'Table\(\s*"(\w+)"', path.read_text()))
    names |= {p.stem for p in (ROOT / "methods").glob("*/sql/views/*.sql")}
    return names


def sql_method_lines() -> dict[str, list[int]]:
    """``{file: [line]}``: lines of reflexdb's own SQL (not comments, not pinned copies) that name a
    method or a method's table or view."""
    objects = re.compile(r"(?<![a-z0-9_])(" + "|".join(sorted(method_objects())) + r")(?![a-z0-9_])")
    found = {}
    for path in sorted((ROOT / "reflexdb" / "sql").rglob("*.sql")):
        if "history" in path.parts:
            continue
        lines = [i for i, line in enumerate(path.read_text().splitlines(), 1)
                 if METHOD_NAME.search(line.split("--")[0]) or objects.search(line.split("--")[0])]
        if lines:
            found[path.relative_to(ROOT).as_posix()] = lines
    return found


def test_shared_sql_reads_no_method_object():
    assert {"reflections", "lte_stages", "replay_requests", "r3l_reflect_set"} <= method_objects()
    found = sql_method_lines()
    more = {f: lines for f, lines in found.items() if len(lines) > KNOWN_SQL_LINES.get(f, 0)}
    assert not more, f"reflexdb's SQL names a method or reads its objects (lines): {more}"
    fewer = {f: (n, len(found.get(f, []))) for f, n in KNOWN_SQL_LINES.items() if len(found.get(f, [])) < n}
    assert not fewer, f"fewer than KNOWN_SQL_LINES allows, so lower it (allowed, found): {fewer}"


def owned_names() -> set[str]:
    """Origins and group kinds a method owns: the rows of the tables of origins (0018) and group
    kinds (0020) whose ``method`` is not NULL, and those a method's own branch inserts."""
    names: set[str] = set()
    for path, at in ((ROOT / "migrations/versions/0018_origins.py", 4), (ROOT / "migrations/versions/0020_group_kinds.py", 3)):
        tree = ast.parse(path.read_text())
        rows = next(n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ROWS")
        names |= {ast.literal_eval(r)[0] for r in rows.elts if ast.literal_eval(r)[at] is not None}
    for path in (ROOT / "methods").glob("*/migrations/*.py"):
        names |= set(re.findall(r"INSERT INTO (?:origins|group_kinds)\b[^;]*?VALUES\s*\(\s*'(\w+)'", path.read_text()))
    return names


#: Quoted method-owned origin and kind names in shared code today (``{file: how many}``): none since
#: revision 0027 gave ``group_kinds`` the facts reflexdb's SQL named ``replay`` for (issue 52).
KNOWN_OWNED: dict[str, int] = {}
#: The same word meaning something else there: ``{file: {word}}`` (an answer format named raw).
HOMONYMS: dict[str, set[str]] = {"collector/tasks/datasets.py": {"raw"}, "explorer/templates/trajectory.html": {"raw"}}


def owned_name_uses() -> dict[str, int]:
    """``{file: lines}`` of shared Python and reflexdb's SQL (pinned copies and comments aside) that
    quote a method-owned origin or kind (``'replay'``, ``"hinted"``)."""
    quoted = re.compile(r"""['"](""" + "|".join(sorted(owned_names())) + r""")['"]""")
    found: dict[str, int] = {}
    for path, rel, _, _ in _modules():
        if rel.startswith("methods/"):
            continue
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
        lines = {t.start[0] for i, t in enumerate(tokens)
                 if t.type == tokenize.STRING and not _docstring(tokens, i) and quoted.fullmatch(t.string)
                 and t.string.strip("'\"") not in HOMONYMS.get(rel, ())}
        if lines:
            found[rel] = len(lines)
    for folder in ("reflexdb/sql", "explorer"):
        for path in sorted((ROOT / folder).rglob("*.sql")):
            if "history" in path.parts:
                continue
            n = sum(1 for line in path.read_text().splitlines() if quoted.search(line.split("--")[0]))
            if n:
                found[path.relative_to(ROOT).as_posix()] = n
    # the explorer's templates and styles: a method's name, origin or kind as a word
    word = re.compile(r"(?<![\w-])(" + "|".join(sorted(owned_names())) + r")(?![\w-])")
    for path in sorted((ROOT / "explorer").rglob("*")):
        if path.suffix in (".html", ".css", ".js"):
            rel = path.relative_to(ROOT).as_posix()
            n = sum(1 for line in path.read_text().splitlines()
                    if {m.group(1) for m in word.finditer(line)} - HOMONYMS.get(rel, set()) or METHOD_NAME.search(line))
            if n:
                found[path.relative_to(ROOT).as_posix()] = n
    return found


def test_shared_code_quotes_no_origin_or_kind_a_method_owns():
    assert {"hinted", "replay", "reflection", "purified"} <= owned_names()
    assert "replayed" not in owned_names() and "fresh" not in owned_names()  # shared ones (method NULL)
    found = owned_name_uses()
    more = {f: n for f, n in found.items() if n > KNOWN_OWNED.get(f, 0)}
    assert not more, f"shared code quotes an origin or group kind a method owns (read its facts instead): {more}"
    fewer = {f: (n, found.get(f, 0)) for f, n in KNOWN_OWNED.items() if found.get(f, 0) < n}
    assert not fewer, f"fewer than KNOWN_OWNED allows, so lower it (allowed, found): {fewer}"


def test_the_checks_see_what_they_are_for(tmp_path):
    """A deferred upward import and a method name in a string are found; a docstring's is not."""
    src = '"""Talks about nexgrpo."""\n\ndef f():\n    from reflexdb.trainer import learner  # noqa\n    return "lte"\n'
    tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    names = [t.string for i, t in enumerate(tokens) if t.type == tokenize.STRING and not _docstring(tokens, i)]
    assert names == ['"lte"']
    tree = ast.parse(src)
    assert [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] == ["reflexdb.trainer"]
    assert _layer("reflexdb.trainer.learner") == "reflexdb.trainer" and _layer("reflexdb.store") == "reflexdb"
    assert _method("reflexdb.methods.lte.workflow") == "lte" and _method("reflexdb.methods") is None
