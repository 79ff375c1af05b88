"""Multi-turn episodes: each turn records its attempt and that attempt's outcome; view episode_turns.

``turns`` gains four nullable columns, filled by the rollout driver (collector/episodes.py):

- ``attempt``: the attempt the turn belongs to (0-based). An assistant turn and the environment's
  feedback on it share the attempt; prompt turns have NULL.
- ``answer``, ``correct``, ``reward``: what the environment made of that assistant turn (the
  extracted answer, whether it was right, the reward function's value). NULL on other turns.

The view ``episode_turns`` (reflexdb/sql/views/episode_turns.sql) shows one row per turn with its
text, token span and whether it trains, so an episode reads top to bottom in psql. Rows written
before this revision keep NULL in the new columns; the view shows them as one-attempt episodes.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op
from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

VIEWS = ("episode_turns",)


def upgrade() -> None:
    op.add_column("turns", sa.Column("attempt", sa.SmallInteger()))
    op.add_column("turns", sa.Column("answer", sa.Text()))
    op.add_column("turns", sa.Column("correct", sa.Boolean()))
    op.add_column("turns", sa.Column("reward", sa.Float()))
    create_views(VIEWS)


def downgrade() -> None:
    drop_views(VIEWS)
    for column in ("reward", "correct", "answer", "attempt"):
        op.drop_column("turns", column)
