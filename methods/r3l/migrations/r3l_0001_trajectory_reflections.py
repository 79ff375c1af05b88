"""R3L's own link from a trajectory to its reflection: table ``trajectory_reflections``.

Until this revision a reflection's own trajectory (origin ``reflection``), its guided retry and its
distilled twin named it in the column ``trajectories.reflection_id``: R3L's column in the table
every method shares. Now the link is a row of R3L's table, written with the group by the
workflow's attachment (methods/r3l/reflections.py), and the column is gone:

- ``trajectory_reflections (trajectory_id, run_id, reflection_id)``: one row per trajectory that
  belongs to a reflection; the trajectory's key is ``(trajectory_id, run_id)`` (trajectories are
  partitioned by run). Like a plug-in's table it has no foreign key to ``trajectories`` (dropping a
  run's partition, ``drop_run_partitions``, then needs to know nothing of it): deleting the run or
  the reflection deletes the link;
- the rows the column held are copied over, every one;
- view ``r3l_reflections`` reads the links (same columns: CREATE OR REPLACE; the other R3L views
  read it and are unchanged).

This is the first revision of R3L's migration branch (``r3l``), which starts from reflexdb's
revision 0018 (docs/store.md "Migration branches").

Revision ID: r3l_0001
Revises:
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

from reflexdb.migrations.sqlfiles import create_views

revision = "r3l_0001"
down_revision = None
branch_labels = ("r3l",)
depends_on = "0018"


def upgrade() -> None:
    op.create_table(
        "trajectory_reflections",
        sa.Column("trajectory_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("reflection_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["reflection_id"], ["reflections.id"], ondelete="CASCADE",
                                name=op.f("fk_trajectory_reflections_reflection_id_reflections")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name=op.f("fk_trajectory_reflections_run_id_runs")),
        sa.PrimaryKeyConstraint("trajectory_id", "run_id", name=op.f("pk_trajectory_reflections")),
    )
    op.create_index(op.f("ix_trajectory_reflections_reflection_id"), "trajectory_reflections", ["reflection_id"])
    op.execute("INSERT INTO trajectory_reflections (trajectory_id, run_id, reflection_id) "
               "SELECT id, run_id, reflection_id FROM trajectories WHERE reflection_id IS NOT NULL")
    create_views(("r3l_reflections",))  # same columns: CREATE OR REPLACE, before the column goes
    op.drop_column("trajectories", "reflection_id")  # its foreign key and index go with it
    # the least-privilege roles, where they exist (reflexdb db roles): collectors write links, all read
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_collector') THEN
            GRANT SELECT, INSERT ON trajectory_reflections TO reflexdb_collector;
            GRANT SELECT ON trajectory_reflections TO reflexdb_learner, reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    op.add_column("trajectories", sa.Column("reflection_id", sa.BigInteger(), nullable=True))
    op.execute("UPDATE trajectories t SET reflection_id = l.reflection_id FROM trajectory_reflections l "
               "WHERE t.id = l.trajectory_id AND t.run_id = l.run_id")
    op.create_foreign_key(op.f("fk_trajectories_reflection_id_reflections"), "trajectories", "reflections",
                          ["reflection_id"], ["id"], ondelete="SET NULL", deferrable=True, initially="DEFERRED")
    op.create_index(op.f("ix_trajectories_reflection_id"), "trajectories", ["reflection_id"])
    create_views(("r3l_reflections",), version="0012")
    op.drop_table("trajectory_reflections")
