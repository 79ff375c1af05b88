"""LTE's own link from a hinted rollout to its hint: table ``trajectory_hints``.

Until this revision a hinted rollout (origin ``hinted``) named its hint in the column
``trajectories.hint_id``: LTE's column in the table every method shares. Now the link is a row of
LTE's table, written with the LTE group by the hint stage's attachment (methods/lte/stages.py),
and the column is gone:

- ``trajectory_hints (trajectory_id, run_id, hint_id)``: one row per trajectory sampled under a
  hint; the trajectory's key is ``(trajectory_id, run_id)`` (trajectories are partitioned by run).
  Like a plug-in's table it has no foreign key to ``trajectories`` (dropping a run's partition,
  ``drop_run_partitions``, then needs to know nothing of it): deleting the run or the hint deletes
  the link;
- the rows the column held are copied over, every one. No view read the column.

This is the first revision of LTE's migration branch (``lte``), which starts from reflexdb's
revision 0018 (docs/store.md "Migration branches").

Revision ID: lte_0001
Revises:
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "lte_0001"
down_revision = None
branch_labels = ("lte",)
depends_on = "0018"


def upgrade() -> None:
    op.create_table(
        "trajectory_hints",
        sa.Column("trajectory_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("hint_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["hint_id"], ["hints.id"], ondelete="CASCADE",
                                name=op.f("fk_trajectory_hints_hint_id_hints")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name=op.f("fk_trajectory_hints_run_id_runs")),
        sa.PrimaryKeyConstraint("trajectory_id", "run_id", name=op.f("pk_trajectory_hints")),
    )
    op.create_index(op.f("ix_trajectory_hints_hint_id"), "trajectory_hints", ["hint_id"])
    op.execute("INSERT INTO trajectory_hints (trajectory_id, run_id, hint_id) "
               "SELECT id, run_id, hint_id FROM trajectories WHERE hint_id IS NOT NULL")
    op.drop_column("trajectories", "hint_id")  # its foreign key goes with it
    # the least-privilege roles, where they exist (reflexdb db roles): collectors write links, all read
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_collector') THEN
            GRANT SELECT, INSERT ON trajectory_hints TO reflexdb_collector;
            GRANT SELECT ON trajectory_hints TO reflexdb_learner, reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    op.add_column("trajectories", sa.Column("hint_id", sa.BigInteger(), nullable=True))
    op.execute("UPDATE trajectories t SET hint_id = l.hint_id FROM trajectory_hints l "
               "WHERE t.id = l.trajectory_id AND t.run_id = l.run_id")
    op.create_foreign_key(op.f("fk_trajectories_hint_id_hints"), "trajectories", "hints", ["hint_id"], ["id"],
                          ondelete="SET NULL")
    op.drop_table("trajectory_hints")
