-- failures: one row per failed trajectory, with everything needed to read why it failed.
--
-- Question it answers: "what did the model get wrong, on which task, with which policy, and how
-- sure was it?" A trajectory has failed when it is not correct: correct = false, or its reward
-- could not be computed (reward IS NULL, correct IS NULL; the reward function's error is in
-- `error`). Replayed copies (origin = 'replayed') are left out: their original is already here;
-- so are R3L's distilled rows (a stitched copy of a guided retry, which is here) and reflections
-- (not an attempt at the task: view r3l_reflections).
-- Columns: run, run_id, task_id, group_id, trajectory_id, split, prompt, response (the assistant
-- turns joined by blank lines), ground_truth, extracted_answer, reward, confidence,
-- policy_version, origin, truncated, finish_reason, error, root_cause (the latest valid
-- reflection's root_cause_analysis, R3L), created_at.
-- Settings read: none.
-- Example: SELECT task_id, extracted_answer, ground_truth, confidence FROM failures
--          WHERE run = 'demo' ORDER BY confidence DESC LIMIT 20;
CREATE OR REPLACE VIEW failures AS
SELECT
    r.name AS run,
    t.run_id,
    t.task_id,
    t.group_id,
    t.id AS trajectory_id,
    k.split,
    k.prompt,
    (SELECT string_agg(u.text, E'\n\n' ORDER BY u.turn_index)
       FROM turns u
      WHERE u.trajectory_id = t.id AND u.role = 'assistant') AS response,
    k.ground_truth,
    t.extracted_answer,
    t.reward,
    t.confidence,
    t.policy_version,
    t.origin,
    t.truncated,
    t.finish_reason,
    t.error,
    (SELECT f.root_cause
       FROM reflections f
      WHERE f.trajectory_id = t.id AND f.valid
      ORDER BY f.created_at DESC, f.id DESC
      LIMIT 1) AS root_cause,
    t.created_at
FROM trajectories t
JOIN runs r ON r.id = t.run_id
JOIN tasks k ON k.id = t.task_id
WHERE t.correct IS NOT TRUE
  AND t.origin NOT IN ('replayed', 'distilled', 'reflection');
