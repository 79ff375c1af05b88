"""Two facts of a group kind, so that reflexdb's own SQL stops naming NexGRPO's kind ``replay``.

Until this revision three places of reflexdb's SQL named the kinds they meant: admission control
counted the groups collectors produce for the learner as ``kind IN ('fresh', 'replay')``
(``work.sql``), ``task_latest_group`` took a task's newest such group, and ``untrained_groups``
ranked ``replay`` groups as a queue of their own when it asked whether a step passed a group over
(NexGRPO caps replay groups per batch). Now they read table ``group_kinds`` (0020):

- ``rollouts``: a group of this kind holds the policy's rollouts of the task's plain prompt (some
  may be replayed copies, origin ``replayed``): a task's newest such group says how the policy
  does on it (``task_latest_group``), and admission control counts such groups as the work the
  collectors produce for the learner. True for ``fresh`` and ``replay``, as the names were.
- ``queue``: the batch queue the learner ranks a group of this kind in (``main``; a method whose
  batch rule takes some kind by a quota of its own names it: ``replay``).

Both have defaults (false, ``main``), so a method's revision that inserts its kinds positionally
(five values) still works. Same rows of every view for the release's kinds; the definitions
before are ``history/task_latest_group.0004.sql`` and ``history/untrained_groups.0024.sql``.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

from reflexdb.migrations.sqlfiles import create_views

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("group_kinds", sa.Column("rollouts", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("group_kinds", sa.Column("queue", sa.Text(), server_default="main", nullable=False))
    op.execute("UPDATE group_kinds SET rollouts = true WHERE name IN ('fresh', 'replay')")
    op.execute("UPDATE group_kinds SET queue = 'replay' WHERE name = 'replay'")
    create_views(("task_latest_group", "untrained_groups"))  # same columns: CREATE OR REPLACE


def downgrade() -> None:
    create_views(("task_latest_group",), version="0004")
    create_views(("untrained_groups",), version="0024")
    op.drop_column("group_kinds", "queue")
    op.drop_column("group_kinds", "rollouts")
