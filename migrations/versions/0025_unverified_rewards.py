"""Rewards scored 0 for want of a verdict are counted per collector (issue 50).

A collector runs its reward function under a deadline (``collector.reward_timeout_s``) and gives
math-verify at most a bounded answer and time: a reward stopped at the deadline, or an answer the
verifier could not check, scores 0 with the reason in ``trajectories.error`` (``RewardTimeout: …``,
``Unverified: …``).

- ``collectors.unverified_rewards``: how many of a collector's rewards were scored so.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("collectors", sa.Column("unverified_rewards", sa.Integer(), server_default=sa.text("0"),
                                          nullable=False))


def downgrade() -> None:
    op.drop_column("collectors", "unverified_rewards")
