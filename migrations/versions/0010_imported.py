"""Imported experience (``reflexdb import``): origin and group kind ``imported``, NULL log-probs.

- ``trajectories.origin`` and ``groups.kind`` accept ``imported``: rows from files (other
  frameworks' rollouts, offline data), written by ``reflexdb import``.
- ``token_payloads.logprobs`` may be NULL: an imported trajectory's behaviour log-probs are not
  known, and NULL says so (never zeros that would read as probability 1).
- ``learner_eligible`` never offers imported groups for training (reason ``imported``), and
  ``untrained_groups`` leaves them out, as it does eval groups.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

from alembic import op

from reflexdb.migrations.sqlfiles import create_views

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

VIEWS = ("learner_eligible", "untrained_groups")
OLD_ORIGINS = "'base', 'distilled', 'guided_retry', 'hinted', 'purified', 'raw', 'replayed'"
OLD_KINDS = "'fresh', 'replay', 'hinted', 'retry', 'eval'"


def _checks(origins: str, kinds: str) -> None:
    op.drop_constraint(op.f("ck_trajectories_origin"), "trajectories", type_="check")
    op.create_check_constraint(op.f("ck_trajectories_origin"), "trajectories", f"origin IN ({origins})")
    op.drop_constraint(op.f("ck_groups_kind"), "groups", type_="check")
    op.create_check_constraint(op.f("ck_groups_kind"), "groups", f"kind IN ({kinds})")


def upgrade() -> None:
    _checks("'base', 'distilled', 'guided_retry', 'hinted', 'imported', 'purified', 'raw', 'replayed'",
            "'fresh', 'replay', 'hinted', 'retry', 'eval', 'imported'")
    op.alter_column("token_payloads", "logprobs", nullable=True)
    # same columns: CREATE OR REPLACE. 0011 changed learner_eligible again: this revision's copy.
    create_views(("learner_eligible",), version="0010")
    create_views(("untrained_groups",), version="0010")  # 0012 changed it: this revision's copy


def downgrade() -> None:
    op.execute("DELETE FROM groups WHERE kind = 'imported'")  # their trajectories and payloads go with them
    create_views(("learner_eligible",), version="0006")
    create_views(("untrained_groups",), version="0009")
    op.alter_column("token_payloads", "logprobs", nullable=False)
    _checks(OLD_ORIGINS, OLD_KINDS)
