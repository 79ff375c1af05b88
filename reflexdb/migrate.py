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
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from .errors import SchemaOutdated


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


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Bring the schema to ``revision`` (default: every branch's head; idempotent there)."""
    command.upgrade(alembic_config(engine), "heads" if revision == "head" else revision)


def downgrade(engine: Engine, revision: str) -> None:
    command.downgrade(alembic_config(engine), revision)


def check_current(engine: Engine) -> None:
    """Raise :class:`SchemaOutdated` unless the database is at the code's head revision."""
    with engine.connect() as conn:
        current = current_revision(conn)
    head = head_revision()
    if current == head:
        return
    if current is None:
        raise SchemaOutdated("the database has no reflexdb schema yet: run `reflexdb db upgrade`")
    script = ScriptDirectory.from_config(alembic_config())
    known = {rev.revision for rev in script.walk_revisions()}
    unknown = sorted(set(current.split(", ")) - known)
    if unknown:
        current = ", ".join(unknown)
        raise SchemaOutdated(
            f"the database schema is at revision {current}, which this installation does not know (a newer "
            f"reflexdb, or a method's package not installed here, wrote it?); upgrade reflexdb or install "
            f"the method, the code's head is {head}"
        )
    raise SchemaOutdated(
        f"the database schema is at revision {current} but this code needs {head}: run `reflexdb db upgrade`"
    )
