"""The groups LTE never trains, for ``Method.drops``: view ``lte_group_drops``.

Collectors' admission control counts the groups coming steps take (reflexdb/work.py); a group the
method's batch rule never takes, counted, moves every later group a place towards a later step,
and at a small ``max_staleness`` a collector waits for a version the learner, waiting for groups,
never trains (issue 60). LTE's such groups: a none-pass group whose hint stage found no correct
extra rollout, under ``lte.unsolved: skip`` (``methods/lte/sql/views/lte_group_drops.sql``). A
replaced original is not one (its LTE group, not counted, takes its place), nor a group held for
its stage (it trains once the stage ends). ``Method.drops`` of ``lte`` names the view; collectors
read it (``sql/roles.sql``).

Revision ID: lte_0004
Revises: lte_0003
Create Date: 2026-12-08
"""

from alembic import op

from reflexdb.migrations.sqlfiles import create_views

revision = "lte_0004"
down_revision = "lte_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_views(("lte_group_drops",))
    # the least-privilege roles, where they exist (reflexdb db roles): collectors' admission reads it
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_collector') THEN
            GRANT SELECT ON lte_group_drops TO reflexdb_collector, reflexdb_learner, reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    op.execute("DROP VIEW lte_group_drops")
