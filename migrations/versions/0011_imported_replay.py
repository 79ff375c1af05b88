"""Imported groups become trainable on request: ``learner.imported_per_step``.

``learner_eligible`` offers imported groups (``reflexdb import``) while the run's setting
``learner.imported_per_step`` is above 0: no staleness rule for them (they have no behaviour
policy and no version; their ``staleness`` column is NULL), only ``max_reuse``. With the setting
at 0 (its default), nothing changes: reason ``imported``, never eligible. The view ``staleness``
gives imported groups NULL staleness too. Same columns; the definitions before are
``reflexdb/sql/views/history/learner_eligible.0010.sql`` and ``staleness.0001.sql``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from reflexdb.migrations.sqlfiles import create_views

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_views(("staleness",))  # same columns: CREATE OR REPLACE
    create_views(("learner_eligible",), version="0011")  # 0012 changed it: this revision's copy


def downgrade() -> None:
    create_views(("learner_eligible",), version="0010")
    create_views(("staleness",), version="0001")
