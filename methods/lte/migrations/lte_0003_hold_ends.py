"""LTE's part of the composed view ``group_hold_ends``: view ``lte_group_hold_ends``.

When LTE let a group it held for its hint stage go: the stage's ``completed_at`` once it is
``done`` (its LTE group trains instead, or it found nothing and the group trains as it is) or
``released`` (the learner took it after the timeout). ``untrained_groups`` then judges the group by
the steps after that moment (reflexdb's revision 0024, issue 37).

Revision ID: lte_0003
Revises: lte_0002
Create Date: 2026-11-26
"""

from alembic import op

from reflexdb.migrations.sqlfiles import create_views

revision = "lte_0003"
down_revision = "lte_0002"
branch_labels = None
depends_on = "0024"


def upgrade() -> None:
    create_views(("lte_group_hold_ends",))
    op.execute("SELECT compose_view('group_hold_ends')")


def downgrade() -> None:
    op.execute("SELECT compose_view('group_hold_ends', 'lte_group_hold_ends')")
    op.execute("DROP VIEW lte_group_hold_ends")
