"""Deleting a run needs no list of the methods' tables: ``drop_run_partitions`` finds them.

Until this revision the function deleted the rows of R3L's ``reflections``, CLEANER's
``purifications`` and NexGRPO's ``replay_requests`` by name before it dropped the run's
trajectories partition (those tables refer to trajectories by a foreign key, so the partition
cannot be detached while they hold rows of it). Now it reads the catalogue: every plain table with
a foreign key to ``trajectories`` has its rows of the run deleted, by the column that refers to
``trajectories.run_id``. A method's table (a plug-in's too) that refers to trajectories is then
deleted with its run without any change in reflexdb (``reflexdb/sql/functions/drop_run_partitions.sql``).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-26
"""

from reflexdb.migrations.sqlfiles import create_functions

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_functions(("drop_run_partitions",))


def downgrade() -> None:
    create_functions(("drop_run_partitions",), version="0015")
