"""R3L's part of the composed view ``failure_notes``: view ``r3l_failure_notes``.

Until reflexdb's revision 0021 the view ``failures`` read R3L's ``reflections`` for its column
``root_cause``. Now R3L contributes the latest valid reflection's root cause of each trajectory
(``methods/r3l/sql/views/r3l_failure_notes.sql``) to ``failure_notes``, which ``failures`` reads.

Revision ID: r3l_0002
Revises: r3l_0001
Create Date: 2026-11-26
"""

from alembic import op

from reflexdb.migrations.sqlfiles import create_views

revision = "r3l_0002"
down_revision = "r3l_0001"
branch_labels = None
depends_on = "0021"


def upgrade() -> None:
    create_views(("r3l_failure_notes",))
    op.execute("SELECT compose_view('failure_notes')")


def downgrade() -> None:
    op.execute("SELECT compose_view('failure_notes', 'r3l_failure_notes')")
    op.execute("DROP VIEW r3l_failure_notes")
