"""Origins as data: a table of where a trajectory may come from, which ``trajectories.origin`` refers to.

Until this revision the origins were a closed list: a check constraint on ``trajectories.origin``
and a tuple in ``reflexdb/origins.py``, both edited (with a migration of the core chain) by every
method that needed a new one. Now they are rows of table ``origins``:

- ``name`` (the key ``trajectories.origin`` refers to; the check constraint is dropped);
- ``pi_old``: the ratio denominator of a row in a loss that has one: ``policy`` (the learner's
  weights at the step's start, or the stored behaviour log-probs, as ``learner.pi_old`` says),
  ``stored`` (always the stored behaviour log-probs) or ``learner`` (always the learner's weights:
  no behaviour log-probs);
- ``pass_at_1``: the row counts in pass@1 (the policy's sample for the plain prompt);
- ``sampled``: the collector that wrote the row generated its tokens just now (its sample counts);
- ``method``: the method that owns the origin (NULL: every method's);
- ``summary``: what a row of this origin is.

A method (a plug-in's too) adds its own origins with a revision of its own that inserts rows; the
collector, the learner and the store read the facts from the table and never decide by a name.
This revision fills the table with the origins of the release before it, their facts unchanged.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

#: (name, pi_old, pass_at_1, sampled, method, summary): the release's origins (reflexdb/origins.py
#: at revision 0017), as they were.
ROWS = (
    ("base", "policy", True, True, None, "sampled by the policy for the task's plain prompt"),
    ("distilled", "stored", False, False, "r3l",
     "R3L: a base episode's turns before the pivot, then a guided retry's turns, guidance removed; "
     "log-probs recomputed under this plain context"),
    ("guided_retry", "stored", False, True, "r3l",
     "R3L: a retry from the pivot with the reflection's guidance in context"),
    ("hinted", "stored", False, True, "lte", "LTE: sampled under a hint; stored with the plain prompt's ids"),
    ("imported", "learner", False, False, None,
     "another framework's rollout (reflexdb import): no behaviour log-probs"),
    ("purified", "stored", True, False, "cleaner",
     "CLEANER: an episode with its failed tool calls rolled back (corrections in their place); log-probs "
     "recomputed under this context. It is the episode's pass@1 sample; its raw twin, in a group of kind "
     "'retry', is not"),
    ("raw", "policy", True, True, "cleaner",
     "CLEANER: a tool-use episode as sampled (failed calls and their errors kept)"),
    ("reflection", "stored", False, True, "r3l",
     "R3L: the policy's reflection on a base episode (prompt: the episode and its feedback)"),
    ("replayed", "stored", False, False, None, "a stored trajectory replayed in a later group (NexGRPO, LTE)"),
)

_CHECK = ("origin IN ('base', 'distilled', 'guided_retry', 'hinted', 'imported', 'purified', 'raw', "
          "'reflection', 'replayed')")


def upgrade() -> None:
    origins = op.create_table(
        "origins",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("pi_old", sa.Text(), nullable=False),
        sa.Column("pass_at_1", sa.Boolean(), nullable=False),
        sa.Column("sampled", sa.Boolean(), nullable=False),
        sa.Column("method", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.CheckConstraint("pi_old IN ('policy', 'stored', 'learner')", name=op.f("ck_origins_pi_old")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_origins")),
    )
    op.bulk_insert(origins, [dict(zip(("name", "pi_old", "pass_at_1", "sampled", "method", "summary"), r))
                             for r in ROWS])
    op.drop_constraint(op.f("ck_trajectories_origin"), "trajectories", type_="check")
    # On the partitioned table: PostgreSQL adds it to every run's partition, and to those created later.
    op.create_foreign_key(op.f("fk_trajectories_origin_origins"), "trajectories", "origins", ["origin"], ["name"])


def downgrade() -> None:
    op.drop_constraint(op.f("fk_trajectories_origin_origins"), "trajectories", type_="foreignkey")
    op.create_check_constraint(op.f("ck_trajectories_origin"), "trajectories", _CHECK)
    op.drop_table("origins")
