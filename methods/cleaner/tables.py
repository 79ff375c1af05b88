"""CLEANER's table: ``purifications`` (core revisions 0013, 0015).

Declared on reflexdb's ``metadata`` (``reflexdb/schema.py``) so that the schema test compares them
with a migrated database; registered in ``reflexdb.plugins.TABLES`` by the package and imported
only when the whole declaration is needed (``schema.full_metadata``): reading a config never loads
SQLAlchemy.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    Index,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
)

from reflexdb.schema import metadata, of_trajectory

# CLEANER rollbacks: one row per failed tool call that was rolled back in a purified trajectory.
purifications = Table(
    "purifications",
    metadata,
    Column("trajectory_id", BigInteger, nullable=False),
    Column("turn_index", SmallInteger, nullable=False),
    Column("attempts", SmallInteger, nullable=False),
    Column("recovered", Boolean, nullable=False),
    Column("similarity", Float),
    Column("replacement", Text),  # shallow | deep | NULL when not recovered
    Column("error_text", Text),
    Column("error_status", Text),  # the failed call's ToolResult status: error | timeout | limit (0013)
    Column("failed_code", Text),
    Column("corrected_code", Text),
    Column("run_id", BigInteger, nullable=False),  # the trajectory's (0015)
    PrimaryKeyConstraint("trajectory_id", "turn_index"),
    of_trajectory(),
    Index(None, "run_id"),
    CheckConstraint("replacement IS NULL OR replacement IN ('shallow', 'deep')", name="replacement"),
    CheckConstraint("error_status IS NULL OR error_status IN ('error', 'timeout', 'limit')", name="error_status"),
)
