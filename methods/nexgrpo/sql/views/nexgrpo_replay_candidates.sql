-- nexgrpo_replay_candidates: the experience pool E, tasks that can be replayed, with their
-- difficulty bucket and sampling weight.
--
-- Rule (NexGRPO.md Sec. 4.3 "Mixed Batch Construction", after ExGRPO; METHODS.md §3): a task is
-- a candidate when both its positive pool P_q and its negative pool N_q hold a trajectory with an
-- embedding (boundary-failure sampling compares hidden states). Tasks are bucketed by k correct
-- of n rollouts in their latest group (task_latest_group: fresh or replay, replayed copies not
-- counted) and weighted
-- by the Gaussian density N(k; n/2, sigma) = exp(-(k - n/2)^2 / (2 sigma^2)) / (sigma sqrt(2 pi)),
-- so tasks the policy solves about half the time are replayed most. The learner draws
-- min(floor(alpha B), |E|) of them per batch, without replacement, with probability proportional
-- to weight. retired marks tasks in nexgrpo_retired_tasks (k = n); their weight is tiny anyway.
-- Columns: run_id, task_id, split, n_positive, n_negative, latest_group_id, k, n, weight, retired.
-- Settings read: nexgrpo.difficulty_sd (sigma, default 1.0), and through nexgrpo_negative_pool
-- nexgrpo.conf_low and nexgrpo.conf_high, from run_settings (through the function run_setting).
-- Example: SELECT k, n, count(*), sum(weight) FROM nexgrpo_replay_candidates
--          WHERE run_id = 1 GROUP BY 1, 2 ORDER BY 1;
CREATE OR REPLACE VIEW nexgrpo_replay_candidates AS
WITH s AS (
    SELECT r.id AS run_id,
           run_setting(r.id, 'nexgrpo.difficulty_sd', '1.0')::float8 AS sd
    FROM runs r
)
SELECT
    d.run_id,
    d.task_id,
    d.split,
    p.n_positive,
    n.n_negative,
    d.group_id AS latest_group_id,
    d.n_correct AS k,
    d.n_rollouts AS n,
    exp(-0.5 * power((d.n_correct - d.n_rollouts / 2.0) / s.sd, 2)) / (s.sd * sqrt(2 * pi())) AS weight,
    (d.n_rollouts > 0 AND d.n_correct = d.n_rollouts) AS retired
FROM task_latest_group d
JOIN s ON s.run_id = d.run_id
CROSS JOIN LATERAL (
    SELECT count(*)::int AS n_positive FROM nexgrpo_positive_pool pp
    WHERE pp.task_id = d.task_id AND pp.has_embedding
) p
CROSS JOIN LATERAL (
    SELECT count(*)::int AS n_negative FROM nexgrpo_negative_pool np
    WHERE np.task_id = d.task_id AND np.has_embedding
) n
WHERE p.n_positive > 0
  AND n.n_negative > 0;
