"""R3L in the store: reflections with their parse errors, the ``reflection`` origin, its views; a
deferred lineage reference; retry groups out of the policy-gradient queue.

- ``trajectories.origin`` accepts ``reflection``: a reflection's own tokens (prompt: the episode
  and its feedback; response: the reflection), the pairs of R3L's reflect set.
- ``reflections``: ``error`` (why a reflection did not parse or is out of range; NULL when valid)
  and ``decoding`` (``free`` or ``json_schema``: how it was sampled).
- ``trajectories.reflection_id`` references ``reflections`` DEFERRABLE INITIALLY DEFERRED, checked
  at commit: a group's transaction writes the reflections after the trajectories they reflect on
  (a reflection refers to its base episode) and the retries that refer to them in the same COPY
  (reflexdb/attachments.py). An index on it for the views' joins.
- ``learner_eligible``: groups of kind ``retry`` (a method's auxiliary rows) are never eligible as
  groups (reason ``auxiliary``); ``untrained_groups`` leaves them out. ``failures`` leaves out
  distilled and reflection rows. Same columns; the definitions before are in ``history/``.
- Views ``r3l_reflections``, ``r3l_reflect_set``, ``r3l_retry_set``, ``r3l_exploration_groups``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

VIEWS = ("r3l_reflections", "r3l_reflect_set", "r3l_retry_set", "r3l_exploration_groups")
ORIGINS = "'base', 'distilled', 'guided_retry', 'hinted', 'imported', 'purified', 'raw', 'reflection', 'replayed'"
OLD_ORIGINS = "'base', 'distilled', 'guided_retry', 'hinted', 'imported', 'purified', 'raw', 'replayed'"
FK = "fk_trajectories_reflection_id_reflections"


def _origins(values: str) -> None:
    op.drop_constraint(op.f("ck_trajectories_origin"), "trajectories", type_="check")
    op.create_check_constraint(op.f("ck_trajectories_origin"), "trajectories", f"origin IN ({values})")


def _fk(**deferred) -> None:
    op.drop_constraint(op.f(FK), "trajectories", type_="foreignkey")
    op.create_foreign_key(op.f(FK), "trajectories", "reflections", ["reflection_id"], ["id"], ondelete="SET NULL",
                          **deferred)


def upgrade() -> None:
    _origins(ORIGINS)
    op.add_column("reflections", sa.Column("error", sa.Text(), nullable=True))
    op.add_column("reflections", sa.Column("decoding", sa.Text(), server_default="free", nullable=False))
    op.create_check_constraint(op.f("ck_reflections_decoding"), "reflections", "decoding IN ('free', 'json_schema')")
    _fk(deferrable=True, initially="DEFERRED")
    op.create_index(op.f("ix_trajectories_reflection_id"), "trajectories", ["reflection_id"])
    create_views(("untrained_groups", "failures"))  # same columns: CREATE OR REPLACE
    create_views(("learner_eligible",), version="0012")  # 0016 changed it: this revision's copy
    create_views(VIEWS)


def downgrade() -> None:
    drop_views(VIEWS)
    create_views(("learner_eligible",), version="0011")
    create_views(("untrained_groups",), version="0010")
    create_views(("failures",), version="0001")
    op.drop_index(op.f("ix_trajectories_reflection_id"), table_name="trajectories")
    _fk()
    op.drop_constraint(op.f("ck_reflections_decoding"), "reflections", type_="check")
    op.drop_column("reflections", "decoding")
    op.drop_column("reflections", "error")
    op.execute("DELETE FROM trajectories WHERE origin = 'reflection'")
    _origins(OLD_ORIGINS)
