"""NexGRPO: replay requests, soft-retirement turns, and the pool views.

- ``replay_requests``: the learner's requests for replay groups, claimed by collectors.
- ``tasks.times_passed`` replaces ``tasks.retired``/``retired_at``: whether a task is retired is
  the view ``nexgrpo_retired_tasks`` (computed from its groups, one source of truth); the column
  counts the turns a retired task was passed over by the soft-retirement draw.
- Views ``task_latest_group``, ``nexgrpo_positive_pool``, ``nexgrpo_negative_pool``,
  ``nexgrpo_retired_tasks``, ``nexgrpo_replay_candidates``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

VIEWS = ("task_latest_group", "nexgrpo_positive_pool", "nexgrpo_negative_pool", "nexgrpo_retired_tasks",
         "nexgrpo_replay_candidates")


def upgrade() -> None:
    op.drop_index("ix_tasks_run_id_split_retired", table_name="tasks")
    op.drop_column("tasks", "retired_at")
    op.drop_column("tasks", "retired")
    op.add_column("tasks", sa.Column("times_passed", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.create_index(op.f("ix_tasks_run_id_split"), "tasks", ["run_id", "split"], unique=False)
    op.create_table(
        "replay_requests",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("positive_id", sa.BigInteger(), nullable=False),
        sa.Column("negative_id", sa.BigInteger(), nullable=False),
        sa.Column("cosine", sa.Float(), nullable=False),
        sa.Column("negative_confidence", sa.Float(), nullable=True),
        sa.Column("refreshed_confidence", sa.Float(), nullable=True),
        sa.Column("discarded", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("group_size", sa.SmallInteger(), nullable=False),
        sa.Column("learner_step", sa.Integer(), nullable=False),
        sa.Column("learner_version", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("claimed_by", sa.Text(), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("group_id", sa.BigInteger(), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('pending', 'claimed', 'done', 'cancelled')",
                           name=op.f("ck_replay_requests_status")),
        sa.CheckConstraint("group_size >= 2", name=op.f("ck_replay_requests_group_size")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_replay_requests_run_id_runs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_replay_requests_task_id_tasks"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["positive_id"], ["trajectories.id"],
                                name=op.f("fk_replay_requests_positive_id_trajectories"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["negative_id"], ["trajectories.id"],
                                name=op.f("fk_replay_requests_negative_id_trajectories"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["group_id"], ["groups.id"], name=op.f("fk_replay_requests_group_id_groups"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replay_requests")),
    )
    op.create_index(op.f("ix_replay_requests_run_id_status_id"), "replay_requests", ["run_id", "status", "id"])
    op.create_index(op.f("ix_replay_requests_group_id"), "replay_requests", ["group_id"])
    # 0006 changed nexgrpo_negative_pool and nexgrpo_replay_candidates: this revision's copies.
    create_views(("task_latest_group", "nexgrpo_positive_pool"))
    create_views(("nexgrpo_negative_pool",), version="0004")
    create_views(("nexgrpo_retired_tasks",))
    create_views(("nexgrpo_replay_candidates",), version="0004")


def downgrade() -> None:
    drop_views(VIEWS)
    op.drop_table("replay_requests")
    op.drop_index(op.f("ix_tasks_run_id_split"), table_name="tasks")
    op.drop_column("tasks", "times_passed")
    op.add_column("tasks", sa.Column("retired", sa.Boolean(), server_default=sa.text("false"), nullable=False))
    op.add_column("tasks", sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_tasks_run_id_split_retired", "tasks", ["run_id", "split", "retired"], unique=False)
