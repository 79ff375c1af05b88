"""sevenths' view of the groups it never trains, its part of the composed view ``group_holds``.

``sevenths_group_holds (group_id, reason)``: every group of a sevenths run (one whose learner
published ``sevenths.every``) whose id is divisible by ``sevenths.every``, reason ``seventh``.
``Method.drops`` names it: admission control and the learner's batch rule read it;
``untrained_groups`` shows its reason.

Revision ID: sevenths_0001
Revises:
Create Date: 2026-12-01
"""

from alembic import op

revision = "sevenths_0001"
down_revision = None
branch_labels = ("sevenths",)
depends_on = "0021"  # reflexdb's composed views (group_holds, compose_view)


def upgrade() -> None:
    op.execute("""
        CREATE VIEW sevenths_group_holds AS
        -- sevenths' part of group_holds: the groups of a sevenths run it never trains, for good.
        SELECT g.id AS group_id, 'seventh'::text AS reason
        FROM groups g
        WHERE g.id % nullif(run_setting(g.run_id, 'sevenths.every', '0')::bigint, 0) = 0""")
    op.execute("SELECT compose_view('group_holds')")
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_collector') THEN
            GRANT SELECT ON sevenths_group_holds TO reflexdb_collector, reflexdb_learner, reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    op.execute("SELECT compose_view('group_holds', 'sevenths_group_holds')")
    op.execute("DROP VIEW sevenths_group_holds")
