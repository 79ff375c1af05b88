-- nexgrpo_retired_tasks: tasks whose latest group was 100% correct (NexGRPO's retirement set S).
--
-- Rule (NexGRPO.md Sec. 4.3 "Soft Retirement"; METHODS.md §3): a query whose current rollout
-- group is entirely correct is retired; collectors of a nexgrpo run then draw it only with
-- probability epsilon (nexgrpo.retire_prob) each time its turn comes, instead of always. "Latest
-- group" and "rollouts" are those of task_latest_group: the newest fresh or replay group, its
-- own rollouts without the replayed copies a replay group carries. A later group that is not all
-- correct un-retires the task.
-- Columns: run_id, task_id, split, group_id (the all-correct latest group), policy_version,
-- n_rollouts, retired_since (that group's created_at).
-- Settings read: none.
-- Example: SELECT count(*) FROM nexgrpo_retired_tasks WHERE run_id = 1 AND split = 'train';
CREATE OR REPLACE VIEW nexgrpo_retired_tasks AS
SELECT run_id, task_id, split, group_id, policy_version, n_rollouts, created_at AS retired_since
FROM task_latest_group
WHERE n_rollouts > 0
  AND n_correct = n_rollouts;
