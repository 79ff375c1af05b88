-- task_latest_group: each task's latest training group and how many of its own rollouts were correct.
--
-- Question it answers: "how does the current policy do on this task?" A task's latest group is
-- its newest fresh or replay group (largest id; eval groups are left out). Its rollouts are the
-- trajectories the policy sampled in it: replayed copies of stored trajectories (origin
-- 'replayed', NexGRPO's y+ and b*) are not counted. NexGRPO reads it twice (METHODS.md §3): a
-- task whose latest group was 100% correct is retired (nexgrpo_retired_tasks), and k of n is the
-- difficulty bucket of a replay candidate (nexgrpo_replay_candidates). Tasks with no such group
-- have no row.
-- Columns: run_id, task_id, split, group_id, policy_version, n_rollouts, n_correct, created_at.
-- Settings read: none.
-- Example: SELECT n_correct, n_rollouts, count(*) FROM task_latest_group WHERE run_id = 1 GROUP BY 1, 2;
CREATE OR REPLACE VIEW task_latest_group AS
SELECT
    k.run_id,
    k.id AS task_id,
    k.split,
    lg.group_id,
    lg.policy_version,
    s.n_rollouts,
    s.n_correct,
    lg.created_at
FROM tasks k
CROSS JOIN LATERAL (
    SELECT g.id AS group_id, g.policy_version, g.created_at
    FROM groups g
    WHERE g.task_id = k.id AND g.kind IN ('fresh', 'replay')
    ORDER BY g.id DESC
    LIMIT 1
) lg
CROSS JOIN LATERAL (
    SELECT count(*)::int AS n_rollouts, (count(*) FILTER (WHERE t.correct))::int AS n_correct
    FROM trajectories t
    WHERE t.group_id = lg.group_id AND t.origin <> 'replayed'
) s;
