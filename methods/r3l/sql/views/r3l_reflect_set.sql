-- r3l_reflect_set: R3L's reflection skill set D_reflect, the (episode + feedback -> reflection)
-- pairs the auxiliary SFT trains on.
--
-- Rule (R3L.md Eq. 9 and Sec. 4.1, "Learning to Reflect and Retry"; METHODS.md §1): only verified
-- corrections, reflections whose retry earned a strictly higher reward than the base episode,
-- R(retry) > R(base). The pair is the reflection's own trajectory (origin 'reflection'): its
-- prompt is the reflection prompt with the base episode and the environment's feedback, its
-- response the reflection as sampled. Each pair is trained at most r3l.sft_max_uses times
-- (trajectories.times_sampled counts the learner steps that took it).
-- Columns: run_id, task_id, reflection_id, trajectory_id (the pair: origin 'reflection'),
-- base_trajectory_id, retry_trajectory_id, base_reward, retry_reward, gain, episode (the
-- reflection prompt's episode log), reflection (its raw text), times_sampled, available
-- (times_sampled < r3l.sft_max_uses), created_at.
-- Settings read: r3l.sft_max_uses (default 1), from run_settings (through the function run_setting).
-- Example: SELECT count(*) FILTER (WHERE available), count(*) FROM r3l_reflect_set WHERE run_id = 1;
CREATE OR REPLACE VIEW r3l_reflect_set AS
SELECT
    r.run_id,
    r.task_id,
    r.reflection_id,
    t.id AS trajectory_id,
    r.base_trajectory_id,
    r.retry_trajectory_id,
    r.base_reward,
    r.retry_reward,
    r.gain,
    (SELECT u.text FROM turns u WHERE u.trajectory_id = t.id AND u.role = 'user'
      ORDER BY u.turn_index DESC LIMIT 1) AS episode,
    r.raw_text AS reflection,
    t.times_sampled,
    t.times_sampled < run_setting(r.run_id, 'r3l.sft_max_uses', '1')::int AS available,
    t.created_at
FROM r3l_reflections r
JOIN trajectories t ON t.id = r.reflection_trajectory_id
WHERE r.retry_reward > r.base_reward;
