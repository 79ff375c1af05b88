"""View learner_eligible: the learner's staleness and reuse rules as SQL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

VIEWS = ("learner_eligible",)


def upgrade() -> None:
    create_views(VIEWS, version="0003")  # 0006 changed learner_eligible: this revision's copy


def downgrade() -> None:
    drop_views(VIEWS)
