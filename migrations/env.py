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

# An upgrade commits revision by revision (a failed one leaves the earlier applied); a downgrade
# (reflexdb/migrate.py sets one_transaction) is one transaction, so a refused step undoes nothing.
one_transaction = bool(context.config.attributes.get("one_transaction"))
# A downgrade's check of the rows of runs it would drop (reflexdb/migrate.py ``RowsGuard``): it looks
# before the first revision runs and again after the last, inside the same transaction; a refusal
# raised there rolls everything back.
guard = context.config.attributes.get("guard")

with engine.connect() as connection:
    connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
    connection.commit()
    try:
        context.configure(connection=connection, target_metadata=full_metadata(),
                          transaction_per_migration=not one_transaction)
        with context.begin_transaction():
            if one_transaction:  # a deferred foreign key's pending checks would stop a later revision's ALTER TABLE
                connection.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
            if guard is not None:
                guard.before(connection)
            context.run_migrations()
            if guard is not None:
                guard.after(connection)
        connection.commit()
    finally:  # a failed migration too: the pooled connection must not keep the lock
        connection.rollback()
        connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
        connection.commit()
