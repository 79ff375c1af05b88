"""A landed migration is never edited (issue 35): migrations/MANIFEST.json holds the SHA-256 of every
landed revision file (reflexdb's chain and each built-in method's branch, methods/*/migrations/) and of every SQL file a revision reads (views, functions and their pinned
copies in history/).

- a revision file or a pinned copy whose text changed fails: write a new revision instead;
- a current view or function file whose text changed passes only once its old text is pinned in
  ``history/<name>.<revision>.sql`` for the revisions that created it (``migrations/sqlfiles.py``
  reads a revision's own pin), so the landed revisions still create what they created;
- a new file is not in the manifest yet: ``python -m tests.unit.test_migration_manifest --add``
  records new files and changed current SQL files whose old text is pinned, and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "migrations" / "MANIFEST.json"
#: reflexdb's SQL folder and each built-in method's: a view or function keeps its name (and its entry
#: here, ``views/<name>.sql``) when its file moves into the package that owns it.
SQL_FOLDERS = (ROOT / "reflexdb" / "sql", *sorted(ROOT.glob("methods/*/sql")))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files() -> dict[str, dict[str, str]]:
    """``{"versions": {file: sha}, "pinned": {...}, "current": {...}}`` as the tree has them now."""
    out: dict[str, dict[str, str]] = {"versions": {}, "pinned": {}, "current": {}}
    for p in sorted((ROOT / "migrations" / "versions").glob("[0-9]*.py")):
        out["versions"][p.name] = _sha(p)
    for p in sorted((ROOT / "methods").glob("*/migrations/*_[0-9]*.py")):  # the methods' own branches
        out["versions"][str(p.relative_to(ROOT))] = _sha(p)
    for folder in SQL_FOLDERS:
        for kind in ("views", "functions"):
            for section, sub in (("pinned", f"{kind}/history"), ("current", kind)):
                for p in sorted((folder / sub).glob("*.sql")):
                    key = f"{sub}/{p.name}"
                    if key in out[section]:  # names are global in the database: one file per name
                        raise AssertionError(f"{key} is in two SQL folders (the second: {folder})")
                    out[section][key] = _sha(p)
    return out


def problems(recorded: dict, now: dict) -> tuple[list[str], list[str]]:
    """``(errors, additions)``: what breaks the rule, and what ``--add`` may record."""
    errors, additions = [], []
    for section in ("versions", "pinned"):
        for name, sha in recorded[section].items():
            if name not in now[section]:
                errors.append(f"{section} {name}: a landed file was deleted")
            elif now[section][name] != sha:
                errors.append(f"{section} {name}: a landed file was edited; write a new revision instead")
        additions += [f"{section} {n}" for n in now[section] if n not in recorded[section]]
    pinned_shas = set(now["pinned"].values())
    for name, sha in recorded["current"].items():
        if name not in now["current"]:
            errors.append(f"current {name}: deleted, but landed revisions read it")
        elif now["current"][name] != sha:
            if sha in pinned_shas:  # the old text is pinned in history/: the landed revisions keep it
                additions.append(f"current {name}")
            else:
                stem = name.split("/")[-1].removesuffix(".sql")
                errors.append(f"current {name}: changed, and the text the landed revisions created is pinned nowhere; "
                              f"copy it to {name.split('/')[0]}/history/{stem}.<revision>.sql for each revision that "
                              "creates it, and create the new text in a new revision")
    additions += [f"current {n}" for n in now["current"] if n not in recorded["current"]]
    return errors, additions


def test_no_landed_migration_or_the_sql_it_reads_was_edited():
    recorded = json.loads(MANIFEST.read_text())
    errors, additions = problems(recorded, files())
    assert not errors, "\n".join(errors)
    assert not additions, ("not in migrations/MANIFEST.json yet (run `python -m tests.unit.test_migration_manifest "
                           "--add` once they are final):\n" + "\n".join(additions))


def test_an_edit_is_caught_and_a_pinned_change_is_allowed():
    recorded = {"versions": {"0001_a.py": "x"}, "pinned": {}, "current": {"views/v.sql": "old"}}
    edited = {"versions": {"0001_a.py": "y"}, "pinned": {}, "current": {"views/v.sql": "new"}}
    errors, _ = problems(recorded, edited)
    assert [e.split(":")[0] for e in errors] == ["versions 0001_a.py", "current views/v.sql"]
    pinned = {"versions": {"0001_a.py": "x"}, "pinned": {"views/history/v.0001.sql": "old"},
              "current": {"views/v.sql": "new"}}
    errors, additions = problems(recorded, pinned)
    assert errors == [] and additions == ["pinned views/history/v.0001.sql", "current views/v.sql"]


def main() -> None:
    recorded = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"versions": {}, "pinned": {}, "current": {}}
    now = files()
    errors, additions = problems(recorded, now)
    if errors:
        sys.exit("refused, the manifest is unchanged:\n" + "\n".join(errors))
    for entry in additions:
        section, name = entry.split(" ", 1)
        recorded[section][name] = now[section][name]
    MANIFEST.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"{len(additions)} file(s) recorded in {MANIFEST.relative_to(ROOT)}")


if __name__ == "__main__" and sys.argv[1:] == ["--add"]:
    main()


def test_an_upgrade_reads_its_own_pinned_copy_and_nothing_else_does(tmp_path, monkeypatch):
    """Pinning an old definition needs no edit of the revision that created it: its upgrade() reads
    history/<name>.<its revision>.sql when that exists (migrations/sqlfiles.py)."""
    from reflexdb.migrations import sqlfiles

    (tmp_path / "sql" / "views" / "history").mkdir(parents=True)
    (tmp_path / "sql" / "views" / "v.sql").write_text("current")
    (tmp_path / "sql" / "views" / "history" / "v.0042.sql").write_text("pinned")
    monkeypatch.setattr("reflexdb.sqlfile.folders", lambda: [("test", tmp_path / "sql")])
    module = {"revision": "0042", "down_revision": "0041", "view_sql": sqlfiles.view_sql}
    exec("def upgrade():\n    return view_sql('v')\n\ndef downgrade():\n    return view_sql('v')\n", module)
    assert module["upgrade"]() == "pinned"
    assert module["downgrade"]() == "current" and sqlfiles.view_sql("v") == "current"
    later = {"revision": "0043", "down_revision": "0042", "view_sql": sqlfiles.view_sql}
    exec("def upgrade():\n    return view_sql('v')\n", later)
    assert later["upgrade"]() == "current"
