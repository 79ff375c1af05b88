"""A group a method held and let go is judged by the steps after it was let go.

Issue 37: ``untrained_groups`` called a none-pass group that LTE held for its hint stage
``passed_over`` once the stage ended: it counted the steps that took newer groups while the group
was held, which they are right to do. Under kill -9 of collectors a stage waits for its dead
claimer's claim to time out, and it may end after the group's staleness window.

- the composed view ``group_hold_ends (group_id, held_until)``: when a method let a held group go
  (LTE's part, ``lte_group_hold_ends`` in LTE's branch ``lte_0003``: the stage's ``completed_at``);
- ``untrained_groups`` counts, for such a group, only the steps that chose their groups after the
  hold ended (the step before them was recorded after it), and gives the reason
  ``held_past_staleness`` when none of those could take it.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-26
"""

from alembic import op

from reflexdb.migrations.sqlfiles import create_views

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("INSERT INTO composed_views (name, columns, types) "
               "VALUES ('group_hold_ends', ARRAY['group_id', 'held_until'], ARRAY['bigint', 'timestamptz'])")
    op.execute("SELECT compose_view('group_hold_ends')")
    create_views(("untrained_groups",))  # same columns: CREATE OR REPLACE
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_learner') THEN
            GRANT SELECT ON group_hold_ends TO reflexdb_learner, reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    create_views(("untrained_groups",), version="0021")
    op.execute("DROP VIEW IF EXISTS group_hold_ends")
    op.execute("DELETE FROM composed_views WHERE name = 'group_hold_ends'")
