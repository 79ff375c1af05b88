"""Reliability: what a learner step could see, idempotent group writes, the untrained_groups view.

- ``groups.xact_id``: the id of the transaction that wrote the group (``pg_current_xact_id()``).
- ``learner_steps.batch_snapshot``: ``pg_current_snapshot()`` of the query that chose the step's
  groups. Together they tell exactly whether a step could see a group, so the view
  ``untrained_groups`` can say why each untrained group was not trained.
- ``groups.write_key``: a key the writer picks once per group; a retried write whose first
  attempt committed finds that group instead of writing it a second time.
- Index ``groups (run_id, policy_version)``: the learner reads only the groups within its
  staleness window (it once skipped groups committed out of id order; docs/reliability.md).

Existing rows get NULL in the new columns (no table rewrite).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

VIEWS = ("untrained_groups",)


def upgrade() -> None:
    op.add_column("groups", sa.Column("xact_id", sa.BigInteger(), nullable=True))
    # Set after the column exists: old rows keep NULL (no rewrite), new rows get their writer's id.
    op.alter_column("groups", "xact_id", server_default=sa.text("(pg_current_xact_id())::text::bigint"))
    op.add_column("groups", sa.Column("write_key", postgresql.UUID(as_uuid=True), nullable=True))
    op.create_unique_constraint(op.f("uq_groups_write_key"), "groups", ["write_key"])
    op.create_index(op.f("ix_groups_run_id_policy_version"), "groups", ["run_id", "policy_version"])
    op.add_column("learner_steps", sa.Column("batch_snapshot", sa.Text(), nullable=True))
    create_views(VIEWS, version="0005")  # 0006 changed untrained_groups: this revision's copy


def downgrade() -> None:
    drop_views(VIEWS)
    op.drop_column("learner_steps", "batch_snapshot")
    op.drop_index(op.f("ix_groups_run_id_policy_version"), table_name="groups")
    op.drop_constraint(op.f("uq_groups_write_key"), "groups", type_="unique")
    op.drop_column("groups", "write_key")
    op.drop_column("groups", "xact_id")
