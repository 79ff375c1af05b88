-- nexgrpo_positive_pool: NexGRPO's positive pool P_q, the correct trajectories of each task.
--
-- Rule (NexGRPO.md Sec. 4.2 "Experience Collection" and Algorithm 1 lines 18-22; METHODS.md §3):
-- a trajectory with reward 1 (correct) is pushed into P_q as a positive anchor. Every group the
-- learner trains on feeds the pool, replay groups included (their fresh rollouts); the replayed
-- copies inside replay groups (origin 'replayed') are left out because their originals are
-- already in, and eval groups never feed it. has_embedding says whether the trajectory has a
-- hidden-state vector phi(o), which boundary-failure sampling needs.
-- Columns: run_id, task_id, trajectory_id, group_id, group_kind, policy_version, reward,
-- confidence, has_embedding, created_at.
-- Settings read: none.
-- Example: SELECT task_id, count(*) FROM nexgrpo_positive_pool WHERE run_id = 1 GROUP BY 1;
CREATE OR REPLACE VIEW nexgrpo_positive_pool AS
SELECT
    t.run_id,
    t.task_id,
    t.id AS trajectory_id,
    t.group_id,
    g.kind AS group_kind,
    t.policy_version,
    t.reward,
    t.confidence,
    EXISTS (SELECT 1 FROM embeddings e WHERE e.trajectory_id = t.id) AS has_embedding,
    t.created_at
FROM trajectories t
JOIN groups g ON g.id = t.group_id
WHERE t.correct
  AND t.origin <> 'replayed'
  AND g.kind IN ('fresh', 'replay');
