-- nexgrpo_negative_pool: NexGRPO's negative pool N_q, the mid-confidence failures of each task.
--
-- Rule (NexGRPO.md Sec. 4.1.1 "Mid-Confidence Failures", Sec. 4.2 and Algorithm 1 lines 23-25;
-- METHODS.md §3): an incorrect trajectory enters N_q only when its confidence
-- l(o) = exp(mean_t log pi_beh(o_t)) lies in the gate [l_low, l_high], both ends included
-- (default [0.2, 0.9]): this filters low-confidence noise and saturated, over-confident errors.
-- The confidence is the one stored at generation (behaviour policy); the learner re-checks the
-- chosen negative under its current weights before replaying it (confidence refresh). Sources
-- as in nexgrpo_positive_pool: fresh and replay groups, replayed copies left out, no eval groups;
-- a trajectory whose reward failed (correct IS NULL) is in neither pool.
-- Columns: run_id, task_id, trajectory_id, group_id, group_kind, policy_version, reward,
-- confidence, conf_low, conf_high, has_embedding, created_at.
-- Settings read: nexgrpo.conf_low (default 0.2), nexgrpo.conf_high (default 0.9), from run_settings
-- (through the function run_setting).
-- Example: SELECT task_id, count(*), avg(confidence) FROM nexgrpo_negative_pool
--          WHERE run_id = 1 GROUP BY 1 ORDER BY 2 DESC;
CREATE OR REPLACE VIEW nexgrpo_negative_pool AS
WITH gate AS (
    SELECT r.id AS run_id,
           run_setting(r.id, 'nexgrpo.conf_low', '0.2')::float8 AS conf_low,
           run_setting(r.id, 'nexgrpo.conf_high', '0.9')::float8 AS conf_high
    FROM runs r
)
SELECT
    t.run_id,
    t.task_id,
    t.id AS trajectory_id,
    t.group_id,
    g.kind AS group_kind,
    t.policy_version,
    t.reward,
    t.confidence,
    s.conf_low,
    s.conf_high,
    EXISTS (SELECT 1 FROM embeddings e WHERE e.trajectory_id = t.id) AS has_embedding,
    t.created_at
FROM trajectories t
JOIN groups g ON g.id = t.group_id
JOIN gate s ON s.run_id = t.run_id
WHERE t.correct = false
  AND t.origin <> 'replayed'
  AND g.kind IN ('fresh', 'replay')
  AND t.confidence >= s.conf_low
  AND t.confidence <= s.conf_high;
