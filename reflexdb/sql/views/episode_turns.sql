-- episode_turns: one row per turn of a trajectory, in order, so an episode reads top to bottom.
--
-- Question it answers: "what happened in this episode, turn by turn: what the model wrote, what
-- the environment answered, which tokens carry loss?" A single-turn trajectory is an episode of
-- one attempt. Prompt turns (system, first user message) have no span: they are the prompt_ids.
-- Columns: run, run_id, task_id, group_id, trajectory_id, turn_index, role, attempt (0-based;
-- NULL for prompt turns), text, token_start, token_end (the span [start, end) in the
-- trajectory's response_ids; NULL for prompt turns), n_tokens, trainable (the span carries loss:
-- the learner's loss mask is the union of the trainable spans), answer, correct, reward (the
-- environment's verdict on an assistant turn; NULL on other turns), feedback (for an assistant
-- turn: the environment's text that followed it, NULL after the last), episode_reward,
-- episode_correct (the trajectory's), attempts (assistant turns in the episode).
-- Settings read: none.
-- Example: SELECT turn_index, role, attempt, n_tokens, trainable, left(text, 60)
--          FROM episode_turns WHERE trajectory_id = 42 ORDER BY turn_index;
CREATE OR REPLACE VIEW episode_turns AS
SELECT
    r.name AS run,
    t.run_id,
    t.task_id,
    t.group_id,
    t.id AS trajectory_id,
    u.turn_index,
    u.role,
    CASE WHEN u.attempt IS NULL AND u.role = 'assistant' THEN 0 ELSE u.attempt END AS attempt,
    u.text,
    u.token_start,
    u.token_end,
    u.token_end - u.token_start AS n_tokens,
    u.trainable,
    u.answer,
    u.correct,
    u.reward,
    CASE WHEN u.role = 'assistant' THEN
        (SELECT f.text FROM turns f
          WHERE f.trajectory_id = u.trajectory_id AND f.turn_index = u.turn_index + 1 AND f.role <> 'assistant')
    END AS feedback,
    t.reward AS episode_reward,
    t.correct AS episode_correct,
    (SELECT count(*) FROM turns a WHERE a.trajectory_id = t.id AND a.role = 'assistant') AS attempts
FROM turns u
JOIN trajectories t ON t.id = u.trajectory_id
JOIN runs r ON r.id = t.run_id;
