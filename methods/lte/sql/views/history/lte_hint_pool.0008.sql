-- lte_hint_pool: one row per none-pass group still waiting for its LTE hint stage.
--
-- Question it answers: "which problems is the model stuck on, and what does it keep answering?"
-- LTE (METHODS.md §2; LTE.md Sec. 3.1) hints a group whose G rollouts all failed: a fresh group
-- (kind 'fresh', not eval or replay) with no correct trajectory, every reward computed (a group
-- whose reward function failed on a row cannot be called none-pass) and no `hints` row yet.
-- hint_kind follows the paper's main text, Sec. 3.1: all responses truncated -> 'concise' (think
-- concisely); some truncated -> 'concise_wrong_answers' (concise + the incorrect answers); none
-- truncated -> 'wrong_answers'. The paper's Algorithm 1 swaps the last two branches; the text is
-- followed here (METHODS.md says the same). wrong_answers are the distinct extracted answers of
-- the non-truncated responses (the paper treats truncated responses as holding no answer), sorted.
-- Columns: run_id, group_id, task_id, split, prompt, ground_truth, policy_version, size,
-- n_truncated, hint_kind, wrong_answers (text[]), answer_counts (jsonb: answer -> how many of the
-- non-truncated responses gave it), created_at, waiting (now() - created_at).
-- Settings read: none.
-- Example: SELECT task_id, hint_kind, wrong_answers, answer_counts FROM lte_hint_pool
--          WHERE run_id = 1 ORDER BY created_at LIMIT 20;
CREATE OR REPLACE VIEW lte_hint_pool AS
SELECT
    g.run_id,
    g.id AS group_id,
    g.task_id,
    k.split,
    k.prompt,
    k.ground_truth,
    g.policy_version,
    g.size,
    s.n_truncated,
    CASE
        WHEN s.n_truncated = s.n_trajectories THEN 'concise'
        WHEN s.n_truncated > 0 THEN 'concise_wrong_answers'
        ELSE 'wrong_answers'
    END AS hint_kind,
    COALESCE(a.answers, '{}'::text[]) AS wrong_answers,
    COALESCE(a.counts, '{}'::jsonb) AS answer_counts,
    g.created_at,
    now() - g.created_at AS waiting
FROM groups g
JOIN tasks k ON k.id = g.task_id
CROSS JOIN LATERAL (
    SELECT
        count(*)::int AS n_trajectories,
        (count(*) FILTER (WHERE t.correct))::int AS n_correct,
        (count(*) FILTER (WHERE t.truncated))::int AS n_truncated,
        (count(*) FILTER (WHERE t.reward IS NULL))::int AS n_reward_missing
    FROM trajectories t
    WHERE t.group_id = g.id
) s
CROSS JOIN LATERAL (
    SELECT array_agg(x.answer ORDER BY x.answer) AS answers, jsonb_object_agg(x.answer, x.n) AS counts
    FROM (
        SELECT t.extracted_answer AS answer, count(*)::int AS n
        FROM trajectories t
        WHERE t.group_id = g.id AND NOT t.truncated AND t.extracted_answer IS NOT NULL
        GROUP BY t.extracted_answer
    ) x
) a
WHERE g.kind = 'fresh'
  AND s.n_trajectories > 0
  AND s.n_correct = 0
  AND s.n_reward_missing = 0
  AND NOT EXISTS (SELECT 1 FROM hints h WHERE h.group_id = g.id);
