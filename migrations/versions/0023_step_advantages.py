"""What advantages a learner step gave its rows, stage by stage.

- ``learner_steps.advantage_stages`` (``text[]``): the names of the step's advantage stages, in
  order: ``group`` (the group normalisation, with the run's ``learner.advantage_scale``), then each
  of the method's advantage transforms by its registered name, e.g. ``{group}`` or
  ``{group,clamp_negative}``.
- ``consumption.advantages`` (``real[]``): the row's advantage after each stage, aligned with its
  step's ``advantage_stages`` (the last element is what the loss used). NULL for a row that has no
  advantage (a method's auxiliary rows, trained by a term of their own) and an element NULL for a
  value that was not finite.

Both are NULL for steps recorded before this revision. ``consumption`` is partitioned by run: the
column added to the parent is added to every partition, and ``create_run_partitions`` makes the
next ones with it (``CREATE TABLE ... PARTITION OF``).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("learner_steps", sa.Column("advantage_stages", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("consumption", sa.Column("advantages", postgresql.ARRAY(postgresql.REAL()), nullable=True))


def downgrade() -> None:
    op.drop_column("consumption", "advantages")
    op.drop_column("learner_steps", "advantage_stages")
