-- failures: one row per failed trajectory, with everything needed to read why it failed.
--
-- Question it answers: "what did the model get wrong, on which task, with which policy, and how
-- sure was it?" A trajectory has failed when it is not correct: correct = false, or its reward
-- could not be computed (reward IS NULL, correct IS NULL; the reward function's error is in
-- `error`). Only rows of an origin whose fact in_failures is true (table origins, revision 0021):
-- a replayed copy is left out (its original is already here), and so are a method's rows that are
-- no attempt at the task or a copy of one (R3L's reflections and distilled rows).
-- Columns: run, run_id, task_id, group_id, trajectory_id, split, prompt, response (the assistant
-- turns joined by blank lines), ground_truth, extracted_answer, reward, confidence,
-- policy_version, origin, truncated, finish_reason, error, root_cause (what a method found the
-- failure's cause to be: the composed view failure_notes, R3L's latest valid reflection's
-- root_cause_analysis; NULL when none), created_at.
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
    (SELECT n.root_cause
       FROM failure_notes n
      WHERE n.trajectory_id = t.id AND n.run_id = t.run_id
      LIMIT 1) AS root_cause,
    t.created_at
FROM trajectories t
JOIN runs r ON r.id = t.run_id
JOIN tasks k ON k.id = t.task_id
JOIN origins o ON o.name = t.origin
WHERE t.correct IS NOT TRUE
  AND o.in_failures;
