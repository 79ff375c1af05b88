"""reflexdb's views read no method's table: what only a method knows comes from composed views.

Until this revision two core views read a method's objects. ``untrained_groups`` read LTE's
``lte_stages`` and settings to name LTE's reasons (``replaced``, ``unsolved``, ``hint_stage``), and
``failures`` read R3L's ``reflections`` for its ``root_cause`` and left out R3L's origins by name.
Now:

- table ``composed_views`` lists the views that are the UNION ALL of the parts methods contribute,
  with their columns: ``group_holds (group_id, reason)``, the groups a method holds back from the
  learner and why, and ``failure_notes (trajectory_id, run_id, root_cause)``, what a method found a
  failure's cause to be;
- the function ``compose_view(target, left_out)`` (``reflexdb/sql/functions/compose_view.sql``)
  creates such a view from every view named ``<method>_<target>``; with none, it is empty, typed;
- ``untrained_groups`` shows the reason ``group_holds`` gives after ``unknown`` (the same place
  LTE's reasons had), and takes training groups by the kind's fact ``trained`` (table
  ``group_kinds``, 0020) where it named ``retry``; ``failures`` reads ``failure_notes`` and the new
  fact ``in_failures`` of table ``origins`` (false for ``replayed``, ``distilled``, ``reflection``,
  the origins it left out by name). Same columns, same rows, once LTE's ``lte_0002`` and R3L's
  ``r3l_0002`` add their parts (their branches depend on this revision).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

from reflexdb.migrations.sqlfiles import create_functions, create_views, drop_functions

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

#: (name, columns, types): the composed views and their columns.
COMPOSED = (
    ("group_holds", ["group_id", "reason"], ["bigint", "text"]),
    ("failure_notes", ["trajectory_id", "run_id", "root_cause"], ["bigint", "bigint", "text"]),
)


def upgrade() -> None:
    op.add_column("origins", sa.Column("in_failures", sa.Boolean(), server_default=sa.true(), nullable=False))
    op.execute("UPDATE origins SET in_failures = false WHERE name IN ('replayed', 'distilled', 'reflection')")
    table = op.create_table(
        "composed_views",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("columns", ARRAY(sa.Text()), nullable=False),
        sa.Column("types", ARRAY(sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_composed_views")),
    )
    op.bulk_insert(table, [dict(name=n, columns=c, types=t) for n, c, t in COMPOSED])
    create_functions(("compose_view",))
    for name, *_ in COMPOSED:
        op.execute(f"SELECT compose_view('{name}')")
    create_views(("untrained_groups", "failures"))  # same columns: CREATE OR REPLACE
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_learner') THEN
            GRANT SELECT ON composed_views, group_holds, failure_notes TO reflexdb_learner, reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    create_views(("untrained_groups",), version="0012")
    create_views(("failures",), version="0012")
    for name, *_ in COMPOSED:
        op.execute(f"DROP VIEW IF EXISTS {name}")
    drop_functions(("compose_view(text, text)",))
    op.drop_table("composed_views")
    op.drop_column("origins", "in_failures")
