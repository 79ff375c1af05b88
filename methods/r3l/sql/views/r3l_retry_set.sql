-- r3l_retry_set: R3L's retry skill set D_retry, the (prefix + guidance -> retry suffix) pairs the
-- auxiliary SFT trains on.
--
-- Rule (R3L.md Eq. 9 and Sec. 4.1; METHODS.md §1): only verified corrections, R(retry) > R(base).
-- The pair is the guided retry's own trajectory (origin 'guided_retry'): its prompt is the base
-- episode's conversation before the pivot followed by the guidance block, its response the
-- corrected suffix as sampled (the environment's turns in it carry no loss). Each pair is trained
-- at most r3l.sft_max_uses times (trajectories.times_sampled).
-- Columns: run_id, task_id, reflection_id, trajectory_id (the pair: origin 'guided_retry'),
-- base_trajectory_id, distilled_trajectory_id, pivot, base_reward, retry_reward, gain, guidance
-- (the guidance block: the prompt's last user message), suffix (the retry's assistant turns
-- joined by blank lines), times_sampled, available (times_sampled < r3l.sft_max_uses), created_at.
-- Settings read: r3l.sft_max_uses (default 1), from run_settings (through the function run_setting).
-- Example: SELECT pivot, count(*), avg(gain) FROM r3l_retry_set WHERE run_id = 1 GROUP BY pivot;
CREATE OR REPLACE VIEW r3l_retry_set AS
SELECT
    r.run_id,
    r.task_id,
    r.reflection_id,
    t.id AS trajectory_id,
    r.base_trajectory_id,
    r.distilled_trajectory_id,
    r.pivot,
    r.base_reward,
    r.retry_reward,
    r.gain,
    (SELECT u.text FROM turns u WHERE u.trajectory_id = t.id AND u.role = 'user' AND u.token_start IS NULL
      ORDER BY u.turn_index DESC LIMIT 1) AS guidance,
    (SELECT string_agg(u.text, E'\n\n' ORDER BY u.turn_index) FROM turns u
      WHERE u.trajectory_id = t.id AND u.role = 'assistant' AND u.token_start IS NOT NULL) AS suffix,
    t.times_sampled,
    t.times_sampled < run_setting(r.run_id, 'r3l.sft_max_uses', '1')::int AS available,
    t.created_at
FROM r3l_reflections r
JOIN trajectories t ON t.id = r.retry_trajectory_id
WHERE r.retry_reward > r.base_reward;
