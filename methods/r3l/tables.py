"""R3L's tables: ``reflections`` (core revisions 0001, 0012, 0015) and ``trajectory_reflections`` (R3L's
branch, r3l_0001).

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
    ForeignKey,
    Identity,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

from reflexdb.schema import created_at, metadata, of_trajectory

reflections = Table(
    "reflections",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    # The trajectory reflected on (R3L base trajectory).
    Column("trajectory_id", BigInteger, nullable=False),
    Column("raw_text", Text, nullable=False),
    Column("parsed", JSONB),
    # retry_from_step: the assistant turn the retry restarts from (0 = initial strategy).
    Column("pivot", Integer),
    Column("outcome", Text),
    Column("root_cause", Text),
    Column("valid", Boolean, nullable=False),
    Column("policy_version", Integer),
    created_at(),
    # Why the reflection is invalid (no JSON, a missing key, an outcome or pivot out of range); NULL when valid (0012).
    Column("error", Text),
    # How it was sampled: 'free' (the paper) or 'json_schema' (constrained to the reflection's schema).
    Column("decoding", Text, nullable=False, server_default="free"),
    CheckConstraint(
        "outcome IS NULL OR outcome IN ('success', 'success_but_inefficient', 'failure')", name="outcome"
    ),
    CheckConstraint("decoding IN ('free', 'json_schema')", name="decoding"),
    Column("run_id", BigInteger, nullable=False),  # the trajectory's (0015)
    of_trajectory(),
    Index(None, "trajectory_id"),
    Index(None, "run_id"),
)

# The reflection a trajectory belongs to (R3L's origins reflection, guided_retry, distilled): R3L's
# branch, r3l_0001. Written with the group (an attachment), removed with the run or the reflection; no
# foreign key to trajectories, like a plug-in's table (drop_run_partitions needs to know nothing of it).
trajectory_reflections = Table(
    "trajectory_reflections",
    metadata,
    Column("trajectory_id", BigInteger, nullable=False),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("reflection_id", BigInteger, ForeignKey("reflections.id", ondelete="CASCADE"), nullable=False),
    PrimaryKeyConstraint("trajectory_id", "run_id"),
    Index(None, "reflection_id"),
)
