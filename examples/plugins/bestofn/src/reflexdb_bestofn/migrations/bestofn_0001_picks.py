"""bestofn's table: each learner step's best answers, one row per group that had one.

Revision ID: bestofn_0001
Revises:
Create Date: 2026-11-29
"""

from alembic import op

revision = "bestofn_0001"
down_revision = None  # the first revision of its own branch...
branch_labels = ("bestofn",)  # ...named as the plug-in
depends_on = "0001"  # the core revision it needs: table runs


def upgrade() -> None:
    op.execute("""
        CREATE TABLE bestofn_picks (
            run_id bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            step integer NOT NULL,
            trajectory_id bigint NOT NULL,
            group_id bigint NOT NULL,
            PRIMARY KEY (run_id, step, trajectory_id)
        )""")
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_learner') THEN
            GRANT SELECT, INSERT, DELETE ON bestofn_picks TO reflexdb_learner;
            GRANT SELECT ON bestofn_picks TO reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    op.execute("DROP TABLE bestofn_picks")
