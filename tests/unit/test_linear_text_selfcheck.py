"""The out-of-tree example plug-in (``examples/plugins/selfcheck``) reads a verdict in time linear
in the size of what the model wrote (issue 50): ``parse_verdict`` on the 1 MB corpus of
``tests/hostile_text.py``, and by hypothesis the first yes or no of any text.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given

from tests.hostile_text import ORDINARY, assert_linear, corpus, hostile_texts

NAMES = list(corpus())
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- selfcheck plug-in


@lru_cache(maxsize=1)
def parse_verdict():
    """The plug-in's ``parse_verdict``, read from its source alone: importing the plug-in would
    register its method, workflow and migrations in this test process."""
    path = ROOT / "examples/plugins/selfcheck/src/reflexdb_selfcheck/workflow.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_VERDICT")
            or (isinstance(n, ast.FunctionDef) and n.name == "parse_verdict")]
    space = {"re": re}
    exec(compile(ast.Module(keep, type_ignores=[]), str(path), "exec"), space)
    return space["parse_verdict"]


@pytest.mark.parametrize("name", NAMES)
def test_a_verdict_is_read_in_linear_time(name):
    assert_linear(parse_verdict(), corpus()[name], name=name)


@ORDINARY
@given(text=hostile_texts())
def test_a_verdict_is_the_first_yes_or_no(text):
    words = re.findall(r"\w+", text)
    first = next((w.lower() for w in words if w.casefold() in ("yes", "no")), None)
    assert parse_verdict()(text) == first
