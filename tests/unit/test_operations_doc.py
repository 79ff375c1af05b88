"""docs/operations.md as a new operator follows it (issue 60): reflexdb installs from its clone (no
package on the index is this project), the database role it sets up may run `reflexdb db roles`,
and the bucket exists before the learner's first publish."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = [p for d in ("reflexdb", "cli", "collector", "trainer", "methods", "explorer") for p in (ROOT / d).rglob("*.py")]


def test_nothing_tells_anyone_to_install_reflexdb_from_the_package_index():
    asked = [f"{p.relative_to(ROOT)}:{n}" for p in PAGES + CODE
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"pip install [^`\n]*['\"]?reflexdb\[", line)]
    assert asked == [], "install from the clone: pip install -e '.[EXTRA]'"
    text = (ROOT / "docs" / "operations.md").read_text()
    assert text.count("pip install -e '.[s3]'") >= 2  # the learner's machine and the collector's


def test_the_operations_role_may_create_the_least_privilege_roles():
    text = (ROOT / "docs" / "operations.md").read_text()
    [role] = re.findall(r"^CREATE ROLE reflexdb .*;$", text, re.M)
    assert "LOGIN" in role and "CREATEROLE" in role  # reflexdb db roles and db user create roles
    assert "| `reflexdb db roles` / `db user` |" in text  # and the privileges table says so


def test_the_bucket_is_created_before_the_learner_publishes_into_it():
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("### A remote collector in two commands", 1)[1].split("\n## ", 1)[0]
    assert "First create the bucket" in section and "aws s3 mb s3://my-bucket" in section
    assert section.index("First create the bucket") < section.index("reflexdb learn -c run.yaml")
    assert "never creates a bucket" in section
