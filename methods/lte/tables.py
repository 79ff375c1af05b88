"""LTE's tables: ``hints`` (core revision 0001), ``lte_stages`` (0009) and ``trajectory_hints`` (LTE's
branch, lte_0001).

Declared on reflexdb's ``metadata`` (``reflexdb/schema.py``) so that the schema test compares them
with a migrated database; registered in ``reflexdb.plugins.TABLES`` by the package and imported
only when the whole declaration is needed (``schema.full_metadata``): reading a config never loads
SQLAlchemy.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY

from reflexdb.schema import created_at, metadata, one_of

#: Values allowed in ``hints.kind`` (LTE, METHODS.md §2).
HINT_KINDS = ("concise", "wrong_answers", "concise_wrong_answers")

hints = Table(
    "hints",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    # The none-pass group the hint was built from (LTE).
    Column("group_id", BigInteger, ForeignKey("groups.id", ondelete="CASCADE"), nullable=False),
    Column("task_id", BigInteger, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("kind", Text, nullable=False),
    Column("wrong_answers", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("hinted_prompt", Text, nullable=False),
    created_at(),
    CheckConstraint(one_of("kind", HINT_KINDS), name="kind"),
    Index(None, "group_id"),
)

#: Values allowed in ``lte_stages.status``.
LTE_STAGE_STATUSES = ("pending", "claimed", "done", "released")
#: Values allowed in ``lte_stages.mode``: hinted extra rollouts (LTE), or plain ones (GRPO_Extra).
LTE_MODES = ("hint", "extra")

# LTE's hint stage of a none-pass group (METHODS.md §2; docs/lte.md): opened as 'pending' from the
# view lte_hint_pool, claimed by a collector (SKIP LOCKED, TTL), 'done' when the collector wrote
# the hints row and, if any extra rollout was correct, the LTE group (same transaction); 'released'
# when the learner took the original group after the stage timed out. A group has at most one.
lte_stages = Table(
    "lte_stages",
    metadata,
    Column("group_id", BigInteger, ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("claimed_by", Text),
    Column("claimed_at", DateTime(timezone=True)),
    Column("mode", Text),  # hint | extra (GRPO_Extra), set when done
    Column("hint_id", BigInteger, ForeignKey("hints.id", ondelete="SET NULL")),
    Column("lte_group_id", BigInteger, ForeignKey("groups.id", ondelete="SET NULL")),  # the group trained instead
    Column("n_sampled", SmallInteger),  # extra rollouts sampled (G)
    Column("n_correct", SmallInteger),  # G': correct ones, each replacing a failed original
    Column("completed_at", DateTime(timezone=True)),
    created_at(),
    CheckConstraint(one_of("status", LTE_STAGE_STATUSES), name="status"),
    CheckConstraint(one_of("mode", LTE_MODES), name="mode"),
    Index(None, "run_id", "status"),
    Index(None, "lte_group_id"),
)

# The hint a trajectory was sampled under (LTE's origin hinted): LTE's branch, lte_0001 (as above).
trajectory_hints = Table(
    "trajectory_hints",
    metadata,
    Column("trajectory_id", BigInteger, nullable=False),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("hint_id", BigInteger, ForeignKey("hints.id", ondelete="CASCADE"), nullable=False),
    PrimaryKeyConstraint("trajectory_id", "run_id"),
    Index(None, "hint_id"),
)
