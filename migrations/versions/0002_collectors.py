"""Collectors: one row per collector process (heartbeat, statistics).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "collectors",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("engine", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=True),
        sa.Column("status", sa.Text(), server_default="running", nullable=False),
        sa.Column("groups_written", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("trajectories_written", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("tokens_generated", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("reward_errors", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("skipped_rows", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('running', 'stopped', 'failed')", name=op.f("ck_collectors_status")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_collectors_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_collectors")),
        sa.UniqueConstraint("run_id", "name", name=op.f("uq_collectors_run_id_name")),
    )


def downgrade() -> None:
    op.drop_table("collectors")
