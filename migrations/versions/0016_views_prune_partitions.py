"""``learner_eligible`` counts a group's consumption in its run's partition only.

Since 0015 ``consumption`` is partitioned by run. The view's per-group count named only the group,
so PostgreSQL probed every run's partition for every candidate group. Naming the run
(``c.run_id = g.run_id``) lets the executor prune to one partition. The learner's choice query
(``eligible_groups``, a run of 400 groups, PostgreSQL 15, a loaded machine) took 3.2 ms with one
run in the database and 10.4 ms with 60; with this change 7.3 ms with 60 (the rest is planning
over the partitions). Same columns and rows; the definition before is
``reflexdb/sql/views/history/learner_eligible.0012.sql``.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25
"""

from reflexdb.migrations.sqlfiles import create_views

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_views(("learner_eligible",))  # same columns: CREATE OR REPLACE


def downgrade() -> None:
    create_views(("learner_eligible",), version="0012")
