-- r3l_reflections: every R3L reflection, with what came of it.
--
-- Question it answers: "what does the model say about its own failures, and did acting on it
-- help?" R3L (R3L.md Sec. 4.1, Fig. 13; METHODS.md §1): for each base episode the policy writes a
-- reflection, JSON with trajectory_summary, root_cause_analysis, trajectory_outcome (success,
-- success_but_inefficient, failure), improvement_suggestion and retry_from_step (the pivot). Every
-- reflection is stored, invalid ones too (valid = false, the raw text and the parse error kept);
-- a valid one whose outcome is not 'success' is retried from the pivot with its guidance in
-- context (origin 'guided_retry'), and the base episode's turns before the pivot followed by the
-- retry's turns, guidance removed, are the distilled trajectory (origin 'distilled', Eq. 8).
-- The retry improved when R(retry) > R(base) (a verified correction, Eq. 9).
-- Columns: reflection_id, run_id, task_id, exploration_group_id (the base episode's group),
-- base_trajectory_id, base_reward, base_turns (assistant turns of the base episode), valid,
-- error (why it did not parse or was out of range; NULL when valid), decoding ('free' or
-- 'json_schema'), outcome, pivot (retry_from_step), root_cause, summary, suggestion, raw_text,
-- reflection_trajectory_id (the reflection's tokens, origin 'reflection'), retry_trajectory_id,
-- distilled_trajectory_id, retry_reward, gain (retry_reward - base_reward), improved,
-- policy_version, created_at.
-- Settings read: none.
-- Example: SELECT outcome, valid, count(*), avg(gain) FROM r3l_reflections WHERE run_id = 1
--          GROUP BY 1, 2;
CREATE OR REPLACE VIEW r3l_reflections AS
SELECT
    f.id AS reflection_id,
    b.run_id,
    b.task_id,
    b.group_id AS exploration_group_id,
    f.trajectory_id AS base_trajectory_id,
    b.reward AS base_reward,
    (SELECT count(*)::int FROM turns u WHERE u.trajectory_id = b.id AND u.role = 'assistant'
       AND u.token_start IS NOT NULL) AS base_turns,
    f.valid,
    f.error,
    f.decoding,
    f.outcome,
    f.pivot,
    f.root_cause,
    f.parsed ->> 'trajectory_summary' AS summary,
    f.parsed ->> 'improvement_suggestion' AS suggestion,
    f.raw_text,
    rt.id AS reflection_trajectory_id,
    gr.id AS retry_trajectory_id,
    d.id AS distilled_trajectory_id,
    gr.reward AS retry_reward,
    gr.reward - b.reward AS gain,
    gr.reward > b.reward AS improved,
    f.policy_version,
    f.created_at
FROM reflections f
JOIN trajectories b ON b.id = f.trajectory_id
LEFT JOIN trajectories rt ON rt.reflection_id = f.id AND rt.origin = 'reflection'
LEFT JOIN trajectories gr ON gr.reflection_id = f.id AND gr.origin = 'guided_retry'
LEFT JOIN trajectories d ON d.reflection_id = f.id AND d.origin = 'distilled';
