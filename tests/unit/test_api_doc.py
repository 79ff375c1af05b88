"""docs/api.md, the reference of a method's author, is generated from the code (tools/apidoc.py): a
changed signature, docstring or table without the doc regenerated fails here, and so does an object
of the reference without a docstring (issue 52)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _apidoc():
    """tools/apidoc.py (a script of the repository, not a module of reflexdb), imported once."""
    if "reflexdb_apidoc" not in sys.modules:
        spec = importlib.util.spec_from_file_location("reflexdb_apidoc", ROOT / "tools" / "apidoc.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["reflexdb_apidoc"]


def test_the_api_reference_is_generated_from_the_code():
    apidoc = _apidoc()
    doc = ROOT / "docs" / "api.md"
    assert doc.read_text() == apidoc.render(), f"docs/api.md is out of date: run `{apidoc.COMMAND}`"


def test_every_object_in_the_api_reference_has_a_docstring():
    documented = _apidoc().documented()
    assert len(documented) > 50
    missing = [label for label, doc in documented if not doc.strip()]
    assert not missing, ("objects of docs/api.md without a docstring (a table: without a comment above its "
                         f"declaration in reflexdb/schema.py): {missing}")


def test_the_reference_renders_a_signature_a_docstring_section_and_a_table():
    apidoc = _apidoc()
    text = apidoc.render()
    # a dataclass's fields with their defaults, a function as its name (never its address)
    assert "    rows: RowSelector = valid_rows\n" in text
    assert " at 0x" not in text
    # Google-style sections become lists
    assert "**Attributes:**\n\n- `name`: the term's name;" in text
    # a table's columns from the metadata, with the comment beside the column in reflexdb/schema.py
    assert "| `reward` | FLOAT | yes |  |  | NULL when the reward function failed (see error) |" in text
    assert apidoc.markdown("Does this.\n\nArgs:\n    a, b: the two;\n        continued.\n\nAfter.") == [
        "Does this.", "", "", "**Args:**", "", "- `a`, `b`: the two; continued.", "", "After."]
