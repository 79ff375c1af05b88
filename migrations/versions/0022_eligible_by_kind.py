"""``learner_eligible`` reads whether a group's kind is trained from table ``group_kinds``.

Until this revision the view named the kinds that are never training data, ``eval`` and ``retry``
(the auxiliary groups of R3L and CLEANER), so a kind a method added with ``trained`` false (0020)
would still have been handed to the learner as a group. Now a group of a kind whose fact
``trained`` is false is not eligible; its reason is ``eval`` for an evaluation group and
``auxiliary`` otherwise, as before for ``retry``. Same columns and, for the release's kinds, the
same rows; the definition before is ``reflexdb/sql/views/history/learner_eligible.0016.sql``.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-26
"""

from reflexdb.migrations.sqlfiles import create_views

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_views(("learner_eligible",))  # same columns: CREATE OR REPLACE


def downgrade() -> None:
    create_views(("learner_eligible",), version="0016")
