"""Group kinds as data: a table of what kind of group a group is, which ``groups.kind`` refers to.

Until this revision the kinds were a closed list: a check constraint on ``groups.kind`` and a
tuple in ``reflexdb/schema.py`` that named the methods' kinds (NexGRPO's ``replay``, LTE's
``hinted``, R3L's and CLEANER's ``retry``), and the collector decided by an ``if`` on the name
``retry`` which rows count in pass@1. Now they are rows of table ``group_kinds``, as origins are
rows of ``origins`` (0018):

- ``name`` (the key ``groups.kind`` refers to; the check constraint is dropped);
- ``trained``: the learner may take such a group as a group of its batch (not ``eval``, not a
  method's auxiliary ``retry`` group, whose rows the method's own views hand over);
- ``pass_at_1``: its rows may count in pass@1, each by its origin's fact (not a ``retry`` group's);
- ``method``: the method that owns the kind (NULL: every method's);
- ``summary``: what a group of this kind is.

A method adds its own kinds with a revision of its own that inserts rows. This revision fills the
table with the kinds of the release before it.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

#: (name, trained, pass_at_1, method, summary): the release's kinds (the check constraint at 0019).
ROWS = (
    ("eval", False, True, None, "an evaluation group (reflexdb eval): never trained"),
    ("fresh", True, True, None, "G rollouts of the current policy for a task, the plain group"),
    ("hinted", True, True, "lte", "LTE: a none-pass group's correct rollouts under a hint, trained in its place"),
    ("imported", True, True, None,
     "another framework's rollouts (reflexdb import), trained with learner.imported_per_step"),
    ("replay", True, True, "nexgrpo",
     "NexGRPO: a stored positive y+ and boundary failure b* replayed with G - 2 fresh rollouts"),
    ("retry", False, False, None,
     "a method's auxiliary rows (R3L's reflections and guided retries, CLEANER's raw twins): not a "
     "group the learner takes, not samples of pass@1; the method's views hand the rows over"),
)

_CHECK = "kind IN ('fresh', 'replay', 'hinted', 'retry', 'eval', 'imported')"


def upgrade() -> None:
    kinds = op.create_table(
        "group_kinds",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("trained", sa.Boolean(), nullable=False),
        sa.Column("pass_at_1", sa.Boolean(), nullable=False),
        sa.Column("method", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_group_kinds")),
    )
    op.bulk_insert(kinds, [dict(zip(("name", "trained", "pass_at_1", "method", "summary"), r)) for r in ROWS])
    op.drop_constraint(op.f("ck_groups_kind"), "groups", type_="check")
    op.create_foreign_key(op.f("fk_groups_kind_group_kinds"), "groups", "group_kinds", ["kind"], ["name"])
    # the least-privilege roles, where they exist (reflexdb db roles): everyone reads the facts
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_collector') THEN
            GRANT SELECT ON group_kinds TO reflexdb_collector, reflexdb_learner, reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    op.drop_constraint(op.f("fk_groups_kind_group_kinds"), "groups", type_="foreignkey")
    op.create_check_constraint(op.f("ck_groups_kind"), "groups", _CHECK)
    op.drop_table("group_kinds")
