"""Alembic migrations of the reflexdb schema (installed as ``reflexdb.migrations``)."""
