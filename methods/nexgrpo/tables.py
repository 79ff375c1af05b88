"""NexGRPO's table: ``replay_requests`` (core revision 0004).

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
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    text,
)

from reflexdb.schema import created_at, metadata, one_of

#: Values allowed in ``replay_requests.status``.
REPLAY_STATUSES = ("pending", "claimed", "done", "cancelled")

# NexGRPO replay requests (METHODS.md §3): the learner asks for a replay group around a stored
# positive anchor y+ and boundary failure b*; a collector claims the request (SKIP LOCKED), samples
# G - 2 fresh rollouts and writes the group of kind 'replay', completing the request in the same
# transaction.
replay_requests = Table(
    "replay_requests",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("task_id", BigInteger, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    # y+ (uniform from the positive pool) and b* (the most similar negative that passed the refresh).
    Column("positive_id", BigInteger, nullable=False),
    Column("negative_id", BigInteger, nullable=False),
    Column("cosine", Float, nullable=False),  # cos(phi(y+), phi(b*))
    Column("negative_confidence", Float),  # b*'s stored (behaviour) confidence
    Column("refreshed_confidence", Float),  # b*'s confidence under the learner's weights at request time
    Column("discarded", SmallInteger, nullable=False, server_default=text("0")),  # more similar candidates the refresh discarded
    Column("group_size", SmallInteger, nullable=False),  # G of the replay group: y+, b* and G - 2 fresh rollouts
    Column("learner_step", Integer, nullable=False),
    Column("learner_version", Integer, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("claimed_by", Text),
    Column("claimed_at", DateTime(timezone=True)),
    Column("group_id", BigInteger, ForeignKey("groups.id", ondelete="SET NULL")),  # the group that fulfilled it
    Column("completed_at", DateTime(timezone=True)),
    created_at(),
    CheckConstraint(one_of("status", REPLAY_STATUSES), name="status"),
    CheckConstraint("group_size >= 2", name="group_size"),
    ForeignKeyConstraint(["positive_id", "run_id"], ["trajectories.id", "trajectories.run_id"], ondelete="CASCADE"),
    ForeignKeyConstraint(["negative_id", "run_id"], ["trajectories.id", "trajectories.run_id"], ondelete="CASCADE"),
    Index(None, "run_id", "status", "id"),
    Index(None, "group_id"),
)
