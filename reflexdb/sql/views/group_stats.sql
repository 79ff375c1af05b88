-- group_stats: one row per group with its outcome summary.
--
-- Question it answers: "how hard was this task for the policy that sampled it?" GRPO's signal
-- vanishes on groups whose rewards are all equal; LTE (METHODS.md §2, paper Fig. 4) counts
-- none-pass and some-pass groups; NexGRPO buckets tasks by k-correct-of-n. class is
-- 'none-pass' (no trajectory correct), 'all-pass' (every trajectory correct) or 'some-pass'.
-- Columns: group_id, run_id, task_id, workflow, kind, policy_version, size, n_trajectories,
-- n_correct, pass_rate (n_correct / n_trajectories), class, n_truncated, n_reward_missing
-- (reward function failed), reward_mean, reward_std (population), confidence_mean, created_at.
-- Settings read: none.
-- Example: SELECT class, count(*) FROM group_stats WHERE run_id = 1 GROUP BY class;
CREATE OR REPLACE VIEW group_stats AS
SELECT
    g.id AS group_id,
    g.run_id,
    g.task_id,
    g.workflow,
    g.kind,
    g.policy_version,
    g.size,
    s.n_trajectories,
    s.n_correct,
    s.n_correct::double precision / NULLIF(s.n_trajectories, 0) AS pass_rate,
    CASE
        WHEN s.n_correct = 0 THEN 'none-pass'
        WHEN s.n_correct = s.n_trajectories THEN 'all-pass'
        ELSE 'some-pass'
    END AS class,
    s.n_truncated,
    s.n_reward_missing,
    s.reward_mean,
    s.reward_std,
    s.confidence_mean,
    g.created_at
FROM groups g
CROSS JOIN LATERAL (
    SELECT
        count(*)::int AS n_trajectories,
        (count(*) FILTER (WHERE t.correct))::int AS n_correct,
        (count(*) FILTER (WHERE t.truncated))::int AS n_truncated,
        (count(*) FILTER (WHERE t.reward IS NULL))::int AS n_reward_missing,
        avg(t.reward) AS reward_mean,
        stddev_pop(t.reward) AS reward_std,
        avg(t.confidence) AS confidence_mean
    FROM trajectories t
    WHERE t.group_id = g.id
) s;
