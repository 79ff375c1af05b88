-- nexgrpo_retired_tasks: tasks whose latest group was 100% correct (NexGRPO's retirement set S).
--
-- Rule (NexGRPO.md Sec. 4.3 "Soft Retirement"; METHODS.md §3): a query whose current rollout
-- group is entirely correct is retired; collectors of a nexgrpo run then draw it only with
-- probability epsilon (nexgrpo.retire_prob) each time its turn comes, instead of always. A task's
-- latest group is its newest fresh or replay group (largest id); "100% correct" counts that
-- group's own rollouts, not the replayed copies (origin 'replayed') a replay group carries. A
-- later group that is not all correct un-retires the task.
-- Columns: run_id, task_id, split, group_id (the all-correct latest group), policy_version,
-- n_rollouts, retired_since (that group's created_at).
-- Settings read: none.
-- Example: SELECT count(*) FROM nexgrpo_retired_tasks WHERE run_id = 1 AND split = 'train';
CREATE OR REPLACE VIEW nexgrpo_retired_tasks AS
SELECT
    k.run_id,
    k.id AS task_id,
    k.split,
    lg.group_id,
    lg.policy_version,
    s.n_rollouts,
    lg.created_at AS retired_since
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
) s
WHERE s.n_rollouts > 0
  AND s.n_correct = s.n_rollouts;
