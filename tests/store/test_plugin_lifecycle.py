"""A method package's life cycle on the command line (issue 52): installed, its branch upgraded, its
rows in runs; a downgrade of its branch refused in one line that names the runs holding its rows and
changes nothing; those runs archived and deleted, the branch downgraded; the package uninstalled
while its branch is still in the database (``db status`` names the revision and what to do, ``db
upgrade`` and ``downgrade`` refuse in one line); reinstalled, up to date again.

The commands run in this process (``reflexdb.cli.main.main``, as the console script calls it), with
"installed" and "uninstalled" made by registering and removing what the selfcheck plug-in
registers for the database (its migration folder, its table of a run's rows), as
``tests/store/test_migration_branches.py`` registers a branch; one command of each state also runs
as a process, with the plug-in's entry point really absent, then present (as
``tests/e2e/test_plugin_selfcheck.py`` installs it)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from reflexdb import Store, migrate, runs
from reflexdb.db import make_engine
from reflexdb.errors import MigrationRefused, UnknownRevision
from reflexdb.plugins import ARCHIVED, MIGRATIONS
from tests.factories import make_group, setup_run
from tests.processes import REFLEXDB, rows

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "selfcheck"


def _install(monkeypatch) -> None:
    """What loading the plug-in registers for the database (its ``Plugin``, src/reflexdb_selfcheck/__init__.py):
    its migration branch and its table of a run's rows (not its tables module: declared on reflexdb's
    metadata, it would stay declared in this process after the test)."""
    MIGRATIONS.names()  # the installed plug-ins loaded first; then the plug-in's parts on copies
    monkeypatch.setattr(MIGRATIONS, "_items", {**MIGRATIONS._items,
                                               "selfcheck": PLUGIN / "src" / "reflexdb_selfcheck" / "migrations"})
    monkeypatch.setattr(ARCHIVED, "_items", {**ARCHIVED._items, "selfcheck": (
        ("selfcheck_verifications", "run_id = %(run)s", "trajectory_id"),)})


def _uninstall(monkeypatch) -> None:
    for registry in (MIGRATIONS, ARCHIVED):
        monkeypatch.setattr(registry, "_items", {k: v for k, v in registry._items.items() if k != "selfcheck"})


@pytest.fixture
def cli(db_url, capsys, monkeypatch, reflexdb_home):
    """``cli(*args)`` runs ``reflexdb ARGS`` on the test's database: (exit code, stdout, stderr)."""
    from reflexdb.cli import main as entry

    monkeypatch.setenv("REFLEXDB_DATABASE_URL", db_url)
    monkeypatch.delenv("REFLEXDB_DEBUG", raising=False)
    for key, value in entry.QUIET_DEFAULTS.items():  # main() sets them: put back after the test
        monkeypatch.setenv(key, os.environ.get(key, value))

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["reflexdb", *args])
        try:
            entry.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _status(store) -> dict:
    return {"heads": rows(store, "SELECT version_num FROM alembic_version ORDER BY 1"),
            "verification": rows(store, "SELECT count(*) FROM trajectories WHERE origin = 'verification'"),
            "verdicts": rows(store, "SELECT count(*) FROM selfcheck_verifications"),
            "table": rows(store, "SELECT to_regclass('selfcheck_calibration')::text")}


def _selfcheck_run(store, name: str, rng) -> int:
    """A run with an answer group and a verification group, and a verdict row."""
    run, [task] = setup_run(store, name, n_tasks=1)
    store.write_group(make_group(rng, run, task, size=2))
    written = store.write_group(make_group(rng, run, task, size=2, origin="verification"))
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO selfcheck_verifications VALUES (:t, :r, :t, 'yes', true, true)"),
                     {"t": written.trajectory_ids[0], "r": run})
    return run


def test_install_upgrade_downgrade_uninstall_reinstall(cli, db_url, tmp_path, monkeypatch):
    env = dict(os.environ, REFLEXDB_DATABASE_URL=db_url, REFLEXDB_HOME=str(tmp_path / "home"))
    env.pop("PYTHONPATH", None)
    built_in = migrate.head_revision()  # reflexdb's chain and the built-in methods' branches

    # installed: `db upgrade` adds its branch; two runs hold its rows, a third none
    _install(monkeypatch)
    code, out, err = cli("db", "upgrade")
    assert code == 0 and out.strip() == f"schema upgraded {built_in} -> {built_in}, selfcheck_0001", err
    rng = np.random.default_rng(0)
    with Store.open(db_url) as store:
        _selfcheck_run(store, "checked-a", rng)
        _selfcheck_run(store, "checked-b", rng)
        plain, [task] = setup_run(store, "plain", n_tasks=1)
        store.write_group(make_group(rng, plain, task, size=2))
        before = _status(store)
    assert before["verification"] == [(4,)] and before["verdicts"] == [(2,)]
    code, out, _ = cli("db", "status")
    assert code == 0 and f"schema revision: {built_in}, selfcheck_0001 (up to date)" in out
    assert [line.split() for line in out.splitlines() if "selfcheck_verifications" in line] == [
        ["selfcheck_verifications", "2"]]  # a plug-in's own table is counted

    # downgrade refused: one line naming the runs and the commands; nothing changed
    code, _, err = cli("db", "downgrade", "selfcheck@base", "--yes")
    assert code == MigrationRefused.exit_code == 1
    assert _one_line_error(err) == (
        "error: cannot downgrade to selfcheck@base: it removes origin 'verification' of method selfcheck, and runs "
        "hold rows of that method's origins and group kinds: run 'checked-a' (origin verification), run "
        "'checked-b' (origin verification); archive each run (`reflexdb db archive RUN -o DIR`: written to Parquet, "
        "checked, then deleted) or delete it (`reflexdb runs delete RUN --yes`), then downgrade again; nothing was "
        "changed")
    with Store.open(db_url) as store:
        assert _status(store) == before

    # the runs archived (its verdicts with it) and deleted; then the downgrade goes through
    code, out, err = cli("db", "archive", "checked-a", "-o", str(tmp_path / "checked-a"))
    assert code == 0 and ["selfcheck_verifications", "1", "rows"] in [line.split() for line in err.splitlines()], err
    code, out, err = cli("runs", "delete", "checked-b", "--yes")
    assert code == 0, err
    code, out, err = cli("db", "downgrade", "selfcheck@base", "--yes")
    assert code == 0 and out.strip() == f"schema downgraded {built_in}, selfcheck_0001 -> {built_in}", err
    with Store.open(db_url, check_schema=False) as store:  # installed, without its branch: to upgrade
        assert rows(store, "SELECT to_regclass('selfcheck_verifications')::text") == [(None,)]
        assert [r["name"] for r in runs.list_runs(store)] == ["plain"]

    # upgraded again, then uninstalled with its branch still in the database
    assert cli("db", "upgrade")[0] == 0
    _uninstall(monkeypatch)
    unknown = ("the database holds revision selfcheck_0001 of migration branch selfcheck, which no installed package "
               "provides: reinstall the package that provides branch selfcheck; or, to remove the branch, with that "
               "package installed archive the runs that use it (`reflexdb db archive RUN -o DIR`) and run "
               "`reflexdb db downgrade selfcheck@base --yes`, then uninstall it")
    code, out, _ = cli("db", "status")
    assert code == 0 and "db upgrade" not in out
    assert f"schema revision:  {built_in}, selfcheck_0001 (code is at {built_in})\n" in out
    assert f"unknown revision: {unknown}\n" in out
    assert any(line.split() == ["selfcheck_verifications", "0"] for line in out.splitlines())
    for args in (("db", "upgrade"), ("db", "downgrade", "selfcheck@base", "--yes")):
        code, _, err = cli(*args)
        assert code == UnknownRevision.exit_code == 4
        assert _one_line_error(err) == f"error: cannot {args[1]}: {unknown}"
    # the same in a process whose installation has no such entry point
    up = subprocess.run(REFLEXDB + ["db", "upgrade"], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 4 and _one_line_error(up.stderr) == f"error: cannot upgrade: {unknown}"

    # reinstalled: up to date again; the archived run comes back, verdicts and all, in a process where
    # the package is installed as pip leaves it (its tables module declares the verdicts' columns)
    _install(monkeypatch)
    code, out, _ = cli("db", "status")
    assert code == 0 and f"schema revision: {built_in}, selfcheck_0001 (up to date)" in out
    info = tmp_path / "site" / "reflexdb_selfcheck-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reflexdb-selfcheck\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[reflexdb.plugins]\nselfcheck = reflexdb_selfcheck\n")
    env["PYTHONPATH"] = f"{info.parent}:{PLUGIN / 'src'}"
    restore = subprocess.run(REFLEXDB + ["db", "restore", str(tmp_path / "checked-a")], env=env, capture_output=True,
                             text=True, timeout=120)
    assert restore.returncode == 0 and "restored run 'checked-a'" in restore.stdout, restore.stderr
    with Store.open(db_url) as store:
        assert rows(store, "SELECT r.name, count(*) FROM selfcheck_verifications v JOIN runs r ON r.id = v.run_id "
                           "GROUP BY 1") == [("checked-a", 1)]

TUTORIAL = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "bestofn"


def test_a_downgrade_that_drops_a_plugins_table_of_runs_rows_is_refused(cli, db_url, tmp_path, monkeypatch):
    """Issue 60: the tutorial's plug-in (docs/tutorial-method.md) writes its own table, bestofn_picks,
    declared in ``Plugin.archived``; it adds no origin or group kind, so no foreign key stopped
    `db downgrade bestofn@base` from dropping the table, and the runs' rows in it, with exit 0. Now
    the downgrade is refused in one line naming the runs and the table, nothing dropped; with those
    runs archived (their picks in the archive) and deleted, it goes through."""
    built_in = migrate.head_revision()
    MIGRATIONS.names()  # what loading the plug-in registers for the database (its Plugin object)
    monkeypatch.setattr(MIGRATIONS, "_items", {**MIGRATIONS._items,
                                               "bestofn": TUTORIAL / "src" / "reflexdb_bestofn" / "migrations"})
    monkeypatch.setattr(ARCHIVED, "_items", {**ARCHIVED._items, "bestofn": (
        ("bestofn_picks", "run_id = %(run)s", "step, trajectory_id"),)})
    with_branch = migrate.head_revision()  # the branches' heads, sorted
    code, out, err = cli("db", "upgrade")
    assert code == 0 and out.strip() == f"schema upgraded {built_in} -> {with_branch}", err
    rng = np.random.default_rng(4)
    with Store.open(db_url) as store:
        for name, picks in (("picked-a", 2), ("picked-b", 1), ("plain", 0)):
            run, [task] = setup_run(store, name, n_tasks=1)
            written = store.write_group(make_group(rng, run, task, size=2))
            with store.engine.begin() as conn:
                for i in range(picks):
                    conn.execute(text("INSERT INTO bestofn_picks VALUES (:r, :s, :t, :g)"),
                                 {"r": run, "s": i + 1, "t": written.trajectory_ids[0], "g": written.group_id})
        picks_before = rows(store, "SELECT * FROM bestofn_picks ORDER BY 1, 2")
    assert len(picks_before) == 3

    code, _, err = cli("db", "downgrade", "bestofn@base", "--yes")
    assert code == MigrationRefused.exit_code == 1
    assert _one_line_error(err) == (
        "error: cannot downgrade to bestofn@base: it drops table bestofn_picks of method package bestofn, and runs "
        "hold rows there: run 'picked-a' (bestofn_picks), run 'picked-b' (bestofn_picks); archive each run "
        "(`reflexdb db archive RUN -o DIR`: written to Parquet, those rows too, checked, then deleted) or delete it "
        "(`reflexdb runs delete RUN --yes`), then downgrade again; or keep the branch (and its package installed) "
        "while those runs are kept; nothing was changed")
    with Store.open(db_url) as store:  # nothing dropped, the revision unchanged
        assert rows(store, "SELECT * FROM bestofn_picks ORDER BY 1, 2") == picks_before
        assert rows(store, "SELECT version_num FROM alembic_version WHERE version_num = 'bestofn_0001'") == [
            ("bestofn_0001",)]

    # one run archived (its picks with it), the other deleted: then the downgrade goes through
    code, _, err = cli("db", "archive", "picked-a", "-o", str(tmp_path / "picked-a"))
    assert code == 0 and ["bestofn_picks", "2", "rows"] in [line.split() for line in err.splitlines()], err
    code, _, err = cli("runs", "delete", "picked-b", "--yes")
    assert code == 0, err
    code, out, err = cli("db", "downgrade", "bestofn@base", "--yes")
    assert code == 0 and out.strip() == f"schema downgraded {with_branch} -> {built_in}", err
    with Store.open(db_url, check_schema=False) as store:
        assert rows(store, "SELECT to_regclass('bestofn_picks')::text") == [(None,)]
        assert [r["name"] for r in runs.list_runs(store)] == ["plain"]


BRANCH = {
    "kindcheck_0001.py": '''"""A test method's origin and group kind.

Revision ID: kindcheck_0001
Revises:
Create Date: 2026-11-29
"""
from alembic import op

revision = "kindcheck_0001"
down_revision = None
branch_labels = ("kindcheck",)
depends_on = "0020"


def upgrade() -> None:
    op.execute("INSERT INTO origins VALUES ('checked', 'stored', false, true, 'kindcheck', 'a test origin')")
    op.execute("INSERT INTO group_kinds VALUES ('checking', false, false, 'kindcheck', 'a test kind')")


def downgrade() -> None:
    op.execute("DELETE FROM group_kinds WHERE name = 'checking'")
    op.execute("DELETE FROM origins WHERE name = 'checked'")
''',
    "kindcheck_0002.py": '''"""A test method's table.

Revision ID: kindcheck_0002
Revises: kindcheck_0001
Create Date: 2026-11-29
"""
from alembic import op

revision = "kindcheck_0002"
down_revision = "kindcheck_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE TABLE kindcheck_notes (id bigint PRIMARY KEY)")


def downgrade() -> None:
    op.execute("DROP TABLE kindcheck_notes")
''',
}


def _branch(tmp_path, monkeypatch, files) -> None:
    folder = tmp_path / f"kindcheck_{len(files)}"
    folder.mkdir(exist_ok=True)
    for name in files:
        (folder / name).write_text(BRANCH[name])
    MIGRATIONS.names()
    monkeypatch.setattr(MIGRATIONS, "_items", {**{k: v for k, v in MIGRATIONS._items.items() if k != "kindcheck"},
                                               "kindcheck": folder})


def test_a_refused_downgrade_names_runs_by_origin_and_kind_and_undoes_every_revision(db_url, tmp_path, monkeypatch):
    built_in = migrate.head_revision()  # reflexdb's chain and the built-in methods' branches
    _branch(tmp_path, monkeypatch, BRANCH)
    engine = make_engine(db_url)
    try:
        migrate.upgrade(engine)
        rng = np.random.default_rng(1)
        with Store.open(db_url) as store:
            by_origin, [t1] = setup_run(store, "by-origin", n_tasks=1)
            store.write_group(make_group(rng, by_origin, t1, size=2, origin="checked"))
            by_kind, [t2] = setup_run(store, "by-kind", n_tasks=1)
            store.write_group(dataclasses.replace(make_group(rng, by_kind, t2, size=2), kind="checking"))
            plain, [t3] = setup_run(store, "plain", n_tasks=1)
            store.write_group(make_group(rng, plain, t3, size=2))
        # kindcheck_0002's downgrade (its table dropped) and kindcheck_0001's (refused) are one transaction
        with pytest.raises(MigrationRefused) as refused:
            migrate.downgrade(engine, "kindcheck@base")
        assert str(refused.value).startswith(
            "cannot downgrade to kindcheck@base: it removes group kind 'checking' of method kindcheck, and runs hold "
            "rows of that method's origins and group kinds: run 'by-origin' (origin checked), run 'by-kind' (group "
            "kind checking); archive each run")
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == migrate.head_revision()  # kindcheck_0002 still
            assert conn.execute(text("SELECT to_regclass('kindcheck_notes')::text")).scalar() == "kindcheck_notes"
            # the migration's advisory lock went with its failure (the next migration would wait on it)
            assert conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                                     "(SELECT oid FROM pg_database WHERE datname = current_database())")).scalar() == 0
        with Store.open(db_url) as store:
            runs.delete(store, by_origin)
            runs.delete(store, by_kind)
        migrate.downgrade(engine, "kindcheck@base")
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == built_in
    finally:
        engine.dispose()


def test_a_newer_version_of_an_installed_package_is_named_and_its_way_back_works(db_url, tmp_path, monkeypatch):
    engine = make_engine(db_url)
    try:
        _branch(tmp_path, monkeypatch, BRANCH)
        migrate.upgrade(engine)
        _branch(tmp_path, monkeypatch, ["kindcheck_0001.py"])  # the package's older version installed
        said = ("the database holds revision kindcheck_0002 of migration branch kindcheck, newer than the installed "
                "package's last (kindcheck_0001): a newer version of that package wrote it; install that version "
                "again, or, to go back to this one, run `reflexdb db downgrade kindcheck@kindcheck_0001 --yes` with "
                "that version installed")
        with pytest.raises(UnknownRevision) as unknown:
            migrate.check_current(engine)
        assert str(unknown.value) == said and unknown.value.revisions == ["kindcheck_0002"]
        with pytest.raises(UnknownRevision, match="^cannot upgrade: the database holds revision kindcheck_0002 "):
            migrate.upgrade(engine)
        _branch(tmp_path, monkeypatch, BRANCH)  # the command it names, with the newer version
        migrate.downgrade(engine, "kindcheck@kindcheck_0001")
        _branch(tmp_path, monkeypatch, ["kindcheck_0001.py"])
        migrate.check_current(engine)
    finally:
        engine.dispose()


def test_unknown_revisions_are_explained_by_whose_they_are():
    [core] = [h for h in migrate.head_revision().split(", ") if h.isdigit()]
    said = migrate.explain_unknown(["0099", "a3f9c2e1b7d4", "gone_method_0002"])
    assert said.startswith("the database holds revision 0099 of reflexdb's own chain, which this reflexdb does not "
                           f"know (its chain ends at {core}; a newer reflexdb wrote it?): upgrade reflexdb here; and revision "
                           "a3f9c2e1b7d4 of a migration branch, which no installed package provides: reinstall the "
                           "package that provides it;")
    assert "`reflexdb db downgrade BRANCH@base --yes`" in said
    assert said.endswith("revision gone_method_0002 of migration branch gone_method, which no installed package "
                         "provides: reinstall the package that provides branch gone_method; or, to remove the "
                         "branch, with that package installed archive the runs that use it (`reflexdb db archive "
                         "RUN -o DIR`) and run `reflexdb db downgrade gone_method@base --yes`, then uninstall it")


def test_unknown_targets_are_refused_in_one_line(db_url):
    engine = make_engine(db_url)
    try:
        with pytest.raises(MigrationRefused, match=r"^cannot downgrade to gone@base: no installed package provides "
                                                   r"migration branch 'gone' \(the branches installed: lte, r3l\); "
                                                   "nothing was changed$"):
            migrate.downgrade(engine, "gone@base")
        with pytest.raises(MigrationRefused, match=r"^cannot upgrade to gone@head: no installed package provides"):
            migrate.upgrade(engine, "gone@head")
        with pytest.raises(MigrationRefused, match=r"^cannot downgrade to gone_0001: Can't locate revision "
                                                   r"identified by 'gone_0001'; nothing was changed$"):
            migrate.downgrade(engine, "gone_0001")
    finally:
        engine.dispose()


def test_training_groups_are_the_groups_of_a_trained_kind(store):
    rng = np.random.default_rng(2)
    run, [task] = setup_run(store, "kinds", n_tasks=1)
    untrained = [k for k, kind in store.group_kinds().items() if not kind.trained]
    assert len(untrained) >= 2  # eval, and a method's auxiliary kind
    store.write_group(make_group(rng, run, task, size=2))
    for kind in untrained:
        store.write_group(dataclasses.replace(make_group(rng, run, task, size=2), kind=kind))
    [listed] = runs.list_runs(store, "kinds")
    assert (listed["groups"], listed["trajectories"]) == (1, 2 * (1 + len(untrained)))
