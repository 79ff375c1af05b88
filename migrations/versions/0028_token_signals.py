"""What a learner step's loss used at each token of a row it trained on (issue 53).

- Table ``token_signals``, one row per consumed row beside its ``consumption`` row (foreign key
  ``(step_id, trajectory_id, run_id)``, deleted with it): per response token the advantage the
  loss used, the log of the importance ratio that entered its clip, whether the clip was active,
  and the entropy of the policy's distribution (trainer/losses/signals.py). Arrays are
  little-endian ``bytea`` like ``token_bytes``': float16 (``advantage``, ``log_ratio``,
  ``entropy``; NaN where the loss gave a token no value, NULL for an array with no value at all)
  and one byte per flag (``clipped``). Written by the learner when
  ``learner.record_token_signals`` is on.
- Partitioned by run like the other per-trajectory tables (0015): ``create_run_partitions``,
  ``drop_run_partitions`` and ``run_partitions_size`` name it (their texts before are pinned in
  ``functions/history/``: ``create_run_partitions.0015``, ``run_partitions_size.0015``,
  ``drop_run_partitions.0019``), and the runs that exist get their partition here.
- SQL function ``float2_array(bytea)`` reads a float16 column as ``real[]``, exactly.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-28
"""

from alembic import op

from reflexdb.migrations.sqlfiles import create_functions, drop_functions

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

#: the functions that list the partitioned tables, with the revision that created their text before
CHANGED = (("create_run_partitions", "0015"), ("run_partitions_size", "0015"), ("drop_run_partitions", "0019"))


def upgrade() -> None:
    create_functions(("float2_array",))
    op.execute("""
        CREATE TABLE token_signals (
            step_id bigint NOT NULL,
            trajectory_id bigint NOT NULL,
            run_id bigint NOT NULL,
            advantage bytea,
            log_ratio bytea,
            clipped bytea NOT NULL,
            entropy bytea NOT NULL,
            CONSTRAINT ck_token_signals_entropy_length CHECK (length(entropy) = 2 * length(clipped)),
            CONSTRAINT ck_token_signals_advantage_length
                CHECK (advantage IS NULL OR length(advantage) = length(entropy)),
            CONSTRAINT ck_token_signals_log_ratio_length
                CHECK (log_ratio IS NULL OR length(log_ratio) = length(entropy)),
            CONSTRAINT pk_token_signals PRIMARY KEY (trajectory_id, step_id, run_id),
            CONSTRAINT fk_token_signals_step_id_consumption FOREIGN KEY (step_id, trajectory_id, run_id)
                REFERENCES consumption (step_id, trajectory_id, run_id) ON DELETE CASCADE
        ) PARTITION BY LIST (run_id)""")
    create_functions(name for name, _ in CHANGED)
    op.execute("SELECT create_run_partitions(id) FROM runs ORDER BY id")


def downgrade() -> None:
    for name, before in CHANGED:
        create_functions((name,), version=before)
    op.execute("DROP TABLE token_signals")  # and every run's partition of it
    drop_functions(("float2_array(bytea)",))
