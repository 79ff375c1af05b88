"""LTE's hint stages: table lte_stages; lte_hint_pool leaves out groups whose stage ended.

- ``lte_stages``: one row per none-pass group whose hint stage was opened (``pending``), claimed
  by a collector (``claimed``: SKIP LOCKED, TTL), finished (``done``: hints row and, when an extra
  rollout was correct, the LTE group, written in one transaction) or given up to the learner after
  the stage timed out (``released``). See docs/lte.md.
- The view ``lte_hint_pool`` now leaves out groups whose stage is done or released (a GRPO_Extra
  stage writes no hints row) and shows the stage's status and claimer.
- The view ``untrained_groups`` names LTE's reasons: ``replaced`` (its LTE group trains instead),
  ``unsolved`` (skipped per ``lte.unsolved``), ``hint_stage`` (held for its stage), none of them
  ``passed_over``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

VIEWS = ("lte_hint_pool",)


def upgrade() -> None:
    op.create_table(
        "lte_stages",
        sa.Column("group_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("claimed_by", sa.Text(), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("mode", sa.Text(), nullable=True),
        sa.Column("hint_id", sa.BigInteger(), nullable=True),
        sa.Column("lte_group_id", sa.BigInteger(), nullable=True),
        sa.Column("n_sampled", sa.SmallInteger(), nullable=True),
        sa.Column("n_correct", sa.SmallInteger(), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('pending', 'claimed', 'done', 'released')", name=op.f("ck_lte_stages_status")),
        sa.CheckConstraint("mode IN ('hint', 'extra')", name=op.f("ck_lte_stages_mode")),
        sa.ForeignKeyConstraint(["group_id"], ["groups.id"], name=op.f("fk_lte_stages_group_id_groups"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_lte_stages_run_id_runs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["hint_id"], ["hints.id"], name=op.f("fk_lte_stages_hint_id_hints"),
                                ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["lte_group_id"], ["groups.id"], name=op.f("fk_lte_stages_lte_group_id_groups"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_lte_stages")),
    )
    op.create_index(op.f("ix_lte_stages_run_id_status"), "lte_stages", ["run_id", "status"])
    op.create_index(op.f("ix_lte_stages_lte_group_id"), "lte_stages", ["lte_group_id"])
    create_views(VIEWS)
    create_views(("untrained_groups",), version="0009")  # same columns: CREATE OR REPLACE (0010 changed it)


def downgrade() -> None:
    create_views(("untrained_groups",), version="0006")  # no longer reads lte_stages
    drop_views(VIEWS)  # CREATE OR REPLACE cannot drop the view's new columns
    create_views(VIEWS, version="0008")
    op.drop_table("lte_stages")
