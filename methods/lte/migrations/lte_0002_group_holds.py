"""LTE's part of the composed view ``group_holds``: view ``lte_group_holds``.

Until reflexdb's revision 0021 the view ``untrained_groups`` named LTE's reasons itself, reading
``lte_stages`` and LTE's settings. Now the rule is LTE's (``methods/lte/sql/views/lte_group_holds.sql``,
the same conditions in the same order): a group whose hint stage wrote an LTE group is ``replaced``,
one whose stage found nothing correct under ``lte.unsolved: skip`` is ``unsolved``, a none-pass
fresh group of an LTE run whose stage has not ended is ``hint_stage``. ``compose_view`` adds it to
``group_holds``, which ``untrained_groups`` reads.

Revision ID: lte_0002
Revises: lte_0001
Create Date: 2026-11-26
"""

from alembic import op

from reflexdb.migrations.sqlfiles import create_views

revision = "lte_0002"
down_revision = "lte_0001"
branch_labels = None
depends_on = "0021"


def upgrade() -> None:
    create_views(("lte_group_holds",))
    op.execute("SELECT compose_view('group_holds')")


def downgrade() -> None:
    op.execute("SELECT compose_view('group_holds', 'lte_group_holds')")
    op.execute("DROP VIEW lte_group_holds")
