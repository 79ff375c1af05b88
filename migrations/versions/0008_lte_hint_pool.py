"""LTE's hint pool: the view lte_hint_pool (none-pass groups waiting for their hint stage).

See ``reflexdb/sql/views/lte_hint_pool.sql`` for the rule (the paper's Sec. 3.1 text, not its
Algorithm 1). The ``hints`` table it reads exists since 0001.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

VIEWS = ("lte_hint_pool",)


def upgrade() -> None:
    create_views(VIEWS, version="0008")  # 0009 changed lte_hint_pool: this revision's copy


def downgrade() -> None:
    drop_views(VIEWS)
