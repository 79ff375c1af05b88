"""Schema migrations (Alembic) driven from Python: upgrade, downgrade, revision checks.

The schema is created and changed only by the revisions in ``migrations/versions``. The store
refuses to work on a database whose revision is not the code's head (:func:`check_current`).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from .errors import SchemaOutdated


def alembic_config(engine: Engine | None = None) -> Config:
    from . import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (idempotent: at head, nothing happens)."""
    command.upgrade(alembic_config(engine), revision)


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
    if current not in known:
        raise SchemaOutdated(
            f"the database schema is at revision {current}, which this version of reflexdb does not "
            f"know (newer code wrote it?); upgrade reflexdb, the code's head is {head}"
        )
    raise SchemaOutdated(
        f"the database schema is at revision {current} but this code needs {head}: run `reflexdb db upgrade`"
    )
