"""Function run_setting: one definition of "a run setting, or its default", called by the views.

``run_setting(run_id bigint, key text, default_value text) RETURNS text`` reads a key of
``run_settings`` as text, or returns the default when the run has none; the caller casts it.
The views ``learner_eligible``, ``nexgrpo_negative_pool``, ``nexgrpo_replay_candidates`` and
``untrained_groups`` each repeated that subquery; they now call the function, with the same
columns and results. The definitions they had before are in ``reflexdb/sql/views/history/``
(the revisions that created them still create those), and the downgrade restores them.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from reflexdb.migrations.sqlfiles import create_functions, create_views, drop_functions

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

FUNCTIONS = ("run_setting",)
SIGNATURES = ("run_setting(bigint, text, text)",)

# Views this revision replaces, in creation order, with the revision whose definition they had.
VIEWS = {
    "learner_eligible": "0003",
    "nexgrpo_negative_pool": "0004",
    "nexgrpo_replay_candidates": "0004",
    "untrained_groups": "0005",
}


def upgrade() -> None:
    create_functions(FUNCTIONS)
    # CREATE OR REPLACE: same columns, so dependent views stay. Later revisions changed
    # learner_eligible (0010) and untrained_groups (0009): this revision's copies.
    create_views([name for name in VIEWS if name not in ("learner_eligible", "untrained_groups")])
    create_views(["learner_eligible", "untrained_groups"], version="0006")


def downgrade() -> None:
    for name, version in VIEWS.items():
        create_views([name], version=version)
    drop_functions(SIGNATURES)
