-- What R3L adds to the trajectory explorer (reflexdb/explorer; docs/explorer.md, "What a method adds").
-- Parameters: %(id)s, %(run_id)s (the trajectory), %(parent)s, %(group_id)s, %(task_id)s.

-- name: links
-- The other rows made under the same reflection (a guided retry and its distilled twin, the
-- reflection's own row), each way. The base episode is their parent (reflexdb's own links).
SELECT 'same reflection #' || a.reflection_id || ' (' || t.origin || ')' AS relation, 'trajectory' AS target,
       t.id::text AS target_id, t.origin || ' #' || t.id AS label
FROM trajectory_reflections a
JOIN trajectory_reflections b ON b.reflection_id = a.reflection_id AND b.trajectory_id <> a.trajectory_id
JOIN trajectories t ON t.id = b.trajectory_id AND t.run_id = b.run_id
WHERE a.trajectory_id = %(id)s AND a.run_id = %(run_id)s
ORDER BY t.id;

-- name: panels
-- The reflection on this episode (a base episode) or the one this row was made under.
SELECT 'R3L reflection #' || f.id || CASE WHEN f.trajectory_id = %(id)s THEN ' on this episode' ELSE '' END AS title,
       x.name, x.value, x.style
FROM reflections f
CROSS JOIN LATERAL (VALUES
    (1, 'valid', f.valid::text, 'text'),
    (2, 'outcome', f.outcome, 'text'),
    (3, 'retry from assistant turn (pivot)', f.pivot::text, 'text'),
    (4, 'root cause', f.root_cause, 'text'),
    (5, 'decoding', f.decoding, 'text'),
    (6, 'parse error', f.error, 'error'),
    (7, 'reflection as written', f.raw_text, 'code')) AS x(n, name, value, style)
WHERE (f.trajectory_id = %(id)s AND f.run_id = %(run_id)s)
   OR f.id IN (SELECT reflection_id FROM trajectory_reflections WHERE trajectory_id = %(id)s AND run_id = %(run_id)s)
ORDER BY f.id, x.n;

-- name: marks
-- The pivot (where turn k starts in the response: tokens before it carry no loss in R3L's policy
-- term, Eq. 10), the guidance of a guided retry, a reflection row's text.
SELECT NULL::int AS turn_index, (t.meta ->> 'pivot_token')::int AS token,
       'pivot: retry from assistant turn ' || (t.meta ->> 'pivot') || '; R3L''s pivotal mask (Eq. 10) clears the tokens before it' AS label,
       'pivot' AS style
FROM trajectories t
WHERE t.id = %(id)s AND t.run_id = %(run_id)s AND t.meta ? 'pivot_token'
UNION ALL
SELECT u.turn_index, NULL, 'guidance (the reflection, after the restored conversation)', 'label'
FROM trajectories t JOIN turns u ON u.trajectory_id = t.id AND u.run_id = t.run_id
WHERE t.id = %(id)s AND t.run_id = %(run_id)s AND t.origin = 'guided_retry'
  AND u.turn_index = (SELECT max(v.turn_index) FROM turns v WHERE v.trajectory_id = t.id AND v.run_id = t.run_id
                      AND v.role = 'user' AND v.token_start IS NULL)
UNION ALL
SELECT u.turn_index, NULL, 'reflection', 'label'
FROM trajectories t JOIN turns u ON u.trajectory_id = t.id AND u.run_id = t.run_id
WHERE t.id = %(id)s AND t.run_id = %(run_id)s AND t.origin = 'reflection' AND u.role = 'assistant';
