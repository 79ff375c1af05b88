"""Self-verification's schema: its origin, its table and its view.

- origin ``verification``: the model's check of one of its answers, sampled for a verification
  prompt (so π_old is the policy's, as for a base row), never a pass@1 sample of the task;
- table ``selfcheck_verifications``: per verification trajectory, the answer it checked, the
  verdict it gave (``yes``, ``no``, or NULL when it gave neither), whether the answer was correct,
  and whether the verdict agreed;
- view ``selfcheck_calibration``: per run and policy version, how often the verdicts agree, how
  often the model says yes to a wrong answer and no to a right one.

Revision ID: selfcheck_0001
Revises:
Create Date: 2026-11-26
"""

from alembic import op

revision = "selfcheck_0001"
down_revision = None
branch_labels = ("selfcheck",)
depends_on = "0018"  # reflexdb's table of origins


def upgrade() -> None:
    op.execute("INSERT INTO origins (name, pi_old, pass_at_1, sampled, method, summary) VALUES "
               "('verification', 'policy', false, true, 'selfcheck', "
               "'selfcheck: the model''s verdict on one of its own answers, sampled for a verification prompt')")
    op.execute("""
        CREATE TABLE selfcheck_verifications (
            trajectory_id bigint NOT NULL,
            run_id bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            answer_trajectory_id bigint NOT NULL,
            verdict text CHECK (verdict IN ('yes', 'no')),
            answer_correct boolean NOT NULL,
            agrees boolean NOT NULL,
            PRIMARY KEY (trajectory_id, run_id)
        )""")
    op.execute("""
        CREATE VIEW selfcheck_calibration AS
        -- Self-verification per run and policy version: how often the model's verdict on its own
        -- answer agrees with the answer's real correctness (selfcheck plug-in).
        SELECT v.run_id, t.policy_version,
               count(*) AS verifications,
               avg(v.agrees::int)::float8 AS agreement,
               avg((v.verdict IS NULL)::int)::float8 AS no_verdict,
               (avg((v.verdict = 'yes')::int) FILTER (WHERE NOT v.answer_correct))::float8 AS yes_to_wrong,
               (avg((v.verdict = 'no')::int) FILTER (WHERE v.answer_correct))::float8 AS no_to_right
        FROM selfcheck_verifications v
        JOIN trajectories t ON t.id = v.trajectory_id AND t.run_id = v.run_id
        GROUP BY v.run_id, t.policy_version""")
    # the least-privilege roles, where they exist (reflexdb db roles): collectors write verdicts, all read
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reflexdb_collector') THEN
            GRANT SELECT, INSERT ON selfcheck_verifications TO reflexdb_collector;
            GRANT SELECT ON selfcheck_verifications, selfcheck_calibration TO reflexdb_learner, reflexdb_reader;
          END IF;
        END $$""")


def downgrade() -> None:
    op.execute("DROP VIEW selfcheck_calibration")
    op.execute("DROP TABLE selfcheck_verifications")
    op.execute("DELETE FROM origins WHERE name = 'verification'")
