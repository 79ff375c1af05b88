"""docs/troubleshooting.md lists every error message the CLI can print.

Every ``raise SomethingError("...")`` of a user-facing error class in the package is found with
``ast``; the longest literal piece of its message must appear in troubleshooting.md (or in a page
it points to for a command's own messages). Internal errors (ValueError, TypeError, ...) and
InvalidGroup (one row covers its FIELD: problem pattern) are left out.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("reflexdb", "cli", "collector", "trainer", "methods")
DOCS = ("troubleshooting.md", "faiss.md")
INTERNAL = {"ValueError", "TypeError", "KeyError", "RuntimeError", "FileNotFoundError", "AssertionError",
            "NotImplementedError", "ImportError", "InvalidGroup", "Exit", "Abort", "BadParameter", "LookupError", "IndexError",
            "AttributeError", "OSError", "SystemExit", "StopIteration",
            "_Skip"}  # _Skip: a dataset row skipped with a FILE:LINE warning (listed as such)


def _pieces(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    if isinstance(node, ast.BinOp):  # "a" + f"b"
        return _pieces(node.left) + _pieces(node.right)
    return []


def user_facing_messages() -> list[tuple[str, str]]:
    """(where, the longest literal piece) of each user-facing raise."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                    continue
                func = node.exc.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in INTERNAL or not node.exc.args:
                    continue
                pieces = [p.strip() for p in _pieces(node.exc.args[0])]
                pieces = [p for p in pieces if len(p) >= 6]
                if pieces:
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", max(pieces, key=len)))
    return found


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.replace("`", "").replace("\\", "")).strip().lower()


def test_every_cli_error_message_is_in_troubleshooting():
    docs = _norm(" ".join((ROOT / "docs" / d).read_text() for d in DOCS))
    messages = user_facing_messages()
    assert len(messages) > 30  # the scan finds the raises
    missing = [(where, msg) for where, msg in messages if _norm(msg)[:40] not in docs]
    assert not missing, "add these to docs/troubleshooting.md:\n" + "\n".join(f"{w}: {m!r}" for w, m in missing)
