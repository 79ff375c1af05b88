"""Schema migrations (Alembic) driven from Python: upgrade, downgrade, revision checks.

The schema is created and changed only by revisions: reflexdb's own chain in
``migrations/versions`` and, beside it, one branch per method that has schema objects of its own
(a plug-in's too), each in the folder the method registers (``reflexdb.plugins.MIGRATIONS``:
name -> folder). Alembic reads all the folders as one script directory (``version_locations``); a
branch's first revision names the core revision it needs (``depends_on``), as a Django app's first
migration names the migrations it depends on. The code's head is then the set of the branches'
heads (one string, sorted, comma-separated: ``0018`` or ``0018, selfcheck_0001``), and the store
refuses to work on a database that is not at all of them (:func:`check_current`): ``reflexdb db
upgrade`` adds what an installed method's branch holds to a database made before it was installed.

A package's life cycle shows here too. Uninstalled while its branch is still in the database, its
revision is one that no installed package provides: Alembic can then neither upgrade nor downgrade
anything, so :func:`upgrade`, :func:`downgrade` and :func:`check_current` refuse with
:class:`UnknownRevision`, naming the revision, its branch (a branch's revisions are named
``<branch>_NNNN``) and the two ways out: reinstall the package, or (with it installed) archive the
runs that use it and downgrade its branch to ``base``. A downgrade runs in one transaction: one that
would remove an origin or a group kind that runs' rows still use rolls back whole and says which runs
(:class:`MigrationRefused`); so does one that would drop (or empty) a method's table of a run's rows
(``Plugin.archived``) while runs hold rows there (:class:`RowsGuard`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from .errors import MigrationRefused, SchemaOutdated, UnknownRevision

#: A branch's revisions are named after it (``<branch>_0001``), reflexdb's own are numbers (``0026``):
#: how a revision whose package is gone still names its branch.
_BRANCH_REVISION = re.compile(r"(?P<branch>.+?)_\d+")
#: The detail PostgreSQL gives a foreign key violation of a DELETE.
_STILL_REFERENCED = re.compile(
    r'Key \((?P<column>[^)]+)\)=\((?P<key>.*)\) is still referenced from table "?(?P<table>[^"]+)"?\.')


def alembic_config(engine: Engine | None = None) -> Config:
    from . import migrations

    from .plugins import MIGRATIONS

    root = Path(migrations.__file__).parent
    cfg = Config()
    cfg.set_main_option("script_location", str(root))
    cfg.set_main_option("version_path_separator", "os")
    cfg.set_main_option("version_locations", os.pathsep.join(
        [str(root / "versions"), *(str(Path(folder)) for _, folder in MIGRATIONS.items())]))
    cfg.attributes["engine"] = engine
    return cfg


def _join(revisions) -> str | None:
    return ", ".join(sorted(revisions)) or None


def head_revision() -> str:
    """The code's head: every branch's head, sorted, comma-separated (one branch: its head)."""
    return _join(ScriptDirectory.from_config(alembic_config()).get_heads())


def current_revision(conn: Connection) -> str | None:
    """The database's revision in the form of :func:`head_revision` (``None``: no schema).

    Alembic's version table holds a branch's head only, not the core revision it depends on: each
    code head that the database's heads include (through ``depends_on`` too) is named as well."""
    heads = MigrationContext.configure(conn).get_current_heads()
    if not heads:
        return None
    script = ScriptDirectory.from_config(alembic_config())
    try:
        applied = {r.revision for r in script.iterate_revisions(tuple(heads), "base")}
    except Exception:  # a revision this code does not know: named as it is (check_current says so)
        return _join(heads)
    return _join(set(heads) | {h for h in script.get_heads() if h in applied})


def unknown_revisions(conn: Connection) -> list[str]:
    """The revisions in the database's version table that no installed package provides, sorted."""
    heads = MigrationContext.configure(conn).get_current_heads()
    known = {r.revision for r in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    return sorted(set(heads) - known)


def _branch_heads(script: ScriptDirectory) -> dict[str, str]:
    """Each installed branch's label and its head revision."""
    return {label: head for head in script.get_heads() for label in script.get_revision(head).branch_labels}


def explain_unknown(revisions: list[str]) -> str:
    """One sentence on revisions no installed package provides: whose they are and what to do.

    A revision named ``<branch>_NNNN`` is of that branch: of a package not installed (reinstall
    it, or remove the branch with it installed), or of a newer version of an installed one; a
    number is reflexdb's own chain, written by a newer reflexdb."""
    script = ScriptDirectory.from_config(alembic_config())
    branches = _branch_heads(script)
    core = _join(h for h in script.get_heads() if h.isdigit())
    parts = []
    for rev in revisions:
        m = _BRANCH_REVISION.fullmatch(rev)
        branch = m["branch"] if m and not rev.isdigit() else None
        if rev.isdigit():
            parts.append(f"revision {rev} of reflexdb's own chain, which this reflexdb does not know (its chain ends "
                         f"at {core}; a newer reflexdb wrote it?): upgrade reflexdb here")
        elif branch in branches:
            parts.append(f"revision {rev} of migration branch {branch}, newer than the installed package's last "
                         f"({branches[branch]}): a newer version of that package wrote it; install that version "
                         f"again, or, to go back to this one, run `reflexdb db downgrade {branch}@{branches[branch]} "
                         "--yes` with that version installed")
        else:
            which = f"migration branch {branch}" if branch else "a migration branch"
            parts.append(f"revision {rev} of {which}, which no installed package provides: reinstall the package "
                         f"that provides {'branch ' + branch if branch else 'it'}; or, to remove the branch, with "
                         "that package installed archive the runs that use it (`reflexdb db archive RUN -o DIR`) "
                         f"and run `reflexdb db downgrade {branch or 'BRANCH'}@base --yes`, then uninstall it")
    return "the database holds " + "; and ".join(parts)


def _refuse_unknown(engine: Engine, verb: str) -> None:
    """Raise :class:`UnknownRevision` when the database holds a revision no installed package provides
    (Alembic would stop on it with a traceback, whatever the target)."""
    with engine.connect() as conn:
        unknown = unknown_revisions(conn)
    if unknown:
        raise UnknownRevision(f"cannot {verb}: {explain_unknown(unknown)}", unknown)


def _check_target(target: str, verb: str) -> None:
    """Refuse ``BRANCH@...`` when no installed package provides the branch (nor is it a revision)."""
    name = target.split("@", 1)[0] if "@" in target else ""
    if not name:
        return
    script = ScriptDirectory.from_config(alembic_config())
    labels = sorted({label for r in script.walk_revisions() for label in r.branch_labels})
    if name in labels or name in {r.revision for r in script.walk_revisions()}:
        return
    raise MigrationRefused(f"cannot {verb} to {target}: no installed package provides migration branch {name!r} "
                           f"(the branches installed: {', '.join(labels) or 'none'}); nothing was changed")


@contextmanager
def _alembic_errors(verb: str, target: str) -> Iterator[None]:
    """Alembic's own refusals (a revision it cannot find, a target that is no ancestor) as one line."""
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    try:
        yield
    except (CommandError, RevisionError) as exc:
        raise MigrationRefused(f"cannot {verb} to {target}: {exc}; nothing was changed") from exc


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Bring the schema to ``revision`` (default: every branch's head; idempotent there).

    Raises:
        UnknownRevision: the database holds a revision no installed package provides.
        MigrationRefused: ``revision`` names a branch or revision no installed package provides.
    """
    target = "heads" if revision == "head" else revision
    _refuse_unknown(engine, "upgrade")
    _check_target(target, "upgrade")
    with _alembic_errors("upgrade", revision):
        command.upgrade(alembic_config(engine), target)


def downgrade(engine: Engine, revision: str) -> None:
    """Bring the schema down to ``revision`` (``BRANCH@base`` removes one branch), in one transaction.

    Raises:
        UnknownRevision: the database holds a revision no installed package provides.
        MigrationRefused: ``revision`` names a branch or revision no installed package provides;
            PostgreSQL refused a step (rows of runs still use an origin or a group kind the
            downgrade removes: the message names the runs); or the downgrade drops a method's table
            in which runs hold rows (:class:`RowsGuard`: the message names the runs and tables). The
            transaction rolled back whole.
    """
    _refuse_unknown(engine, "downgrade")
    _check_target(revision, "downgrade")
    cfg = alembic_config(engine)
    cfg.attributes["one_transaction"] = True  # migrations/env.py: a refused step leaves nothing half done
    cfg.attributes["guard"] = RowsGuard(revision)  # and so does one that would drop rows of runs
    try:
        with _alembic_errors("downgrade", revision):
            command.downgrade(cfg, revision)
    except DBAPIError as exc:
        raise _refused(engine, revision, exc) from exc


class RowsGuard:
    """A downgrade's check that no run loses the rows it holds in a method's own tables.

    The tables are those a method package declares as holding rows of a run (``Plugin.archived``,
    the registry ``ARCHIVED``: what ``reflexdb db archive`` carries), such as the tutorial's
    ``bestofn_picks``. No foreign key stops a revision that drops one (its rows refer to ``runs``,
    not the other way round), so :meth:`before` (inside the downgrade's transaction, before its first
    revision) notes which runs hold rows in each, and :meth:`after` (after its last revision, before
    the commit) refuses with :class:`MigrationRefused` when one of those tables is gone or empty:
    the transaction rolls back and nothing is dropped. A downgrade that drops ``runs`` itself
    (``base``) removes every run, as asked, and is not refused. A table whose branch's downgrade
    copies its rows back into reflexdb's own tables before dropping it (``Plugin.kept_by_downgrade``:
    R3L's and LTE's links, split out of ``trajectories``) loses nothing and is not checked.

    Args:
        target: the revision the downgrade goes to (for the message).
    """

    #: the alias of ``runs`` a table's condition is evaluated against (``%(run)s`` becomes its id)
    ALIAS = "reflexdb_guarded_run"

    def __init__(self, target: str):
        from .plugins import ARCHIVED, LOADED

        self.target = target
        archived = ARCHIVED.items()  # the plug-ins loaded first
        kept = {t for _, plugin, _ in LOADED.values() if plugin is not None for t in plugin.kept_by_downgrade}
        self.tables = {table: (owner, where) for owner, own in archived for table, where, _ in own if table not in kept}
        self.held: dict[str, list[str]] = {}  # table -> the runs with rows there, in id order

    @staticmethod
    def _exists(conn: Connection, table: str) -> bool:
        return conn.exec_driver_sql("SELECT to_regclass(%(t)s) IS NOT NULL", {"t": table}).scalar()

    def before(self, conn: Connection) -> None:
        """Note the runs that hold rows in each method table (on the downgrade's connection)."""
        if not self._exists(conn, "runs"):
            return
        quote = conn.dialect.identifier_preparer.quote
        for table, (_, where) in self.tables.items():
            if not self._exists(conn, table):
                continue
            condition = where % {"run": f"{self.ALIAS}.id"}
            names = [name for (name,) in conn.exec_driver_sql(
                f"SELECT name FROM runs AS {self.ALIAS} WHERE EXISTS "
                f"(SELECT 1 FROM {quote(table)} WHERE {condition}) ORDER BY id")]
            if names:
                self.held[table] = names

    def after(self, conn: Connection) -> None:
        """Raise :class:`MigrationRefused` if a table that held rows of runs is gone or empty now."""
        if not self.held or not self._exists(conn, "runs"):
            return
        quote = conn.dialect.identifier_preparer.quote
        lost = {table: names for table, names in self.held.items()
                if not self._exists(conn, table)
                or not conn.exec_driver_sql(f"SELECT EXISTS (SELECT 1 FROM {quote(table)})").scalar()}
        if lost:
            raise MigrationRefused(self.message(lost))

    def message(self, lost: dict[str, list[str]]) -> str:
        """The refusal: the tables and their packages, the runs with rows there, the ways out."""
        tables = ", ".join(f"{t} of method package {self.tables[t][0]}" for t in lost)
        runs: dict[str, list[str]] = {}
        for table, names in lost.items():
            for name in names:
                runs.setdefault(name, []).append(table)
        held = ", ".join(f"run {name!r} ({', '.join(tables_)})" for name, tables_ in runs.items())
        return (f"cannot downgrade to {self.target}: it drops table{'s' if len(lost) > 1 else ''} {tables}, and runs "
                f"hold rows there: {held}; archive each run (`reflexdb db archive RUN -o DIR`: written to Parquet, "
                "those rows too, checked, then deleted) or delete it (`reflexdb runs delete RUN --yes`), then "
                "downgrade again; or keep the branch (and its package installed) while those runs are kept; "
                "nothing was changed")


def _refused(engine: Engine, target: str, exc: DBAPIError) -> MigrationRefused:
    """The one-line refusal of a downgrade PostgreSQL stopped: for an origin or a group kind that rows
    still use, the runs that hold them and how to remove those runs; else PostgreSQL's own words."""
    from . import runs

    diag = getattr(exc.orig, "diag", None)
    primary = (diag.message_primary if diag else None) or str(exc.orig)
    detail = diag.message_detail if diag else None
    said = f"{primary}" + (f" ({detail})" if detail else "")
    held = _STILL_REFERENCED.fullmatch(detail or "")
    if held and diag.constraint_name:
        with engine.connect() as conn:
            referenced = conn.exec_driver_sql(
                "SELECT confrelid::regclass::text FROM pg_constraint "
                "WHERE conname = %(c)s AND conrelid = %(t)s::regclass",
                {"c": diag.constraint_name, "t": diag.table_name}).scalar()
            kinds = {"origins": "origin", "group_kinds": "group kind"}
            if referenced in kinds:
                key = held["key"]
                holders = runs.holding(conn, origins=[key] if referenced == "origins" else [],
                                       kinds=[key] if referenced == "group_kinds" else [])
                if holders:
                    methods = sorted({m for _, _, ms in holders for m in ms or ()})
                    names = ", ".join(f"run {name!r} ({', '.join(uses)})" for name, uses, _ in holders)
                    of = (f" of method {', '.join(methods)}, and runs hold rows of that method's origins and group "
                          "kinds" if methods else ", and runs hold rows of it")
                    return MigrationRefused(
                        f"cannot downgrade to {target}: it removes {kinds[referenced]} {key!r}{of}: {names}; archive "
                        "each run (`reflexdb db archive RUN -o DIR`: written to Parquet, checked, then deleted) or "
                        "delete it (`reflexdb runs delete RUN --yes`), then downgrade again; nothing was changed")
    return MigrationRefused(f"cannot downgrade to {target}: PostgreSQL refused it: {said}; nothing was changed")


def check_current(engine: Engine) -> None:
    """Raise :class:`SchemaOutdated` unless the database is at the code's head revision
    (:class:`UnknownRevision` when it holds a revision no installed package provides)."""
    with engine.connect() as conn:
        current = current_revision(conn)
    head = head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaOutdated("the database has no reflexdb schema yet: run `reflexdb db upgrade`")
    with engine.connect() as conn:
        unknown = unknown_revisions(conn)
    if unknown:
        raise UnknownRevision(explain_unknown(unknown), unknown)
    raise SchemaOutdated(
        f"the database schema is at revision {current} but this code needs {head}: run `reflexdb db upgrade`"
    )
