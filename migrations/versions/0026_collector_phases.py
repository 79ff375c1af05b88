"""Where each collector's time goes, in the database (issue 51).

A collector times its phases (``reflexdb/timing.py``: generate, score, reward, write) and its
heartbeat now stores the running totals, so that the learner can log them to MLflow (collectors
write nothing there) and anyone can ask SQL where a run's collectors spend their time.

- ``collectors.phase_seconds``: jsonb, the collector's cumulative seconds per phase since it
  started, with ``wall`` (the seconds since its first timed phase); ``{}`` until its first
  heartbeat.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("collectors", sa.Column("phase_seconds", postgresql.JSONB(astext_type=sa.Text()),
                                          server_default=sa.text("'{}'::jsonb"), nullable=False))


def downgrade() -> None:
    op.drop_column("collectors", "phase_seconds")
