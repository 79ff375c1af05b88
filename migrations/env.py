"""Alembic environment: runs migrations on the engine reflexdb hands over (never from an ini)."""

from alembic import context
from sqlalchemy import text

from reflexdb.schema import full_metadata

engine = context.config.attributes.get("engine")
if engine is None:  # pragma: no cover - `alembic` CLI use
    from reflexdb.db import make_engine

    engine = make_engine()

# Serialise concurrent `reflexdb db upgrade` runs (several collectors starting at once).
MIGRATION_LOCK = 0x7265666C  # "refl"

with engine.connect() as connection:
    connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
    connection.commit()
    context.configure(connection=connection, target_metadata=full_metadata(), transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
    connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
    connection.commit()
