-- What CLEANER adds to the trajectory explorer (reflexdb/explorer; docs/explorer.md, "What a method adds").
-- Parameters: %(id)s, %(run_id)s (the trajectory), %(parent)s, %(group_id)s, %(task_id)s.
-- The raw and the purified row are each other's parent and child (reflexdb's own links).

-- name: panels
-- Each rollback of a purified row (shown on it and on its raw twin): the failed call, the error it
-- got and the correction that replaced it.
SELECT 'CLEANER rollback at turn ' || p.turn_index || ' of purified #' || p.trajectory_id AS title,
       x.name, x.value, x.style
FROM purifications p
CROSS JOIN LATERAL (VALUES
    (1, 'recovered', p.recovered::text, 'text'),
    (2, 'replacement', p.replacement, 'text'),
    (3, 'similarity', round(p.similarity::numeric, 3)::text, 'text'),
    (4, 'correction attempts', p.attempts::text, 'text'),
    (5, 'failed call', p.failed_code, 'code'),
    (6, 'its error (' || coalesce(p.error_status, 'error') || ')', p.error_text, 'error'),
    (7, 'the correction that replaced it', p.corrected_code, 'code')) AS x(n, name, value, style)
WHERE p.run_id = %(run_id)s
  AND (p.trajectory_id = %(id)s
       OR p.trajectory_id IN (SELECT c.id FROM trajectories c
                              WHERE c.parent_trajectory_id = %(id)s AND c.run_id = %(run_id)s))
ORDER BY p.trajectory_id, p.turn_index, x.n;

-- name: marks
-- On a purified row, the turn that replaced a failed call.
SELECT p.turn_index, NULL::int AS token,
       'rolled back: this turn replaced a failed call (' || coalesce(p.error_status, 'error') || '); the raw twin keeps it'
           AS label,
       'rollback' AS style
FROM purifications p
WHERE p.trajectory_id = %(id)s AND p.run_id = %(run_id)s;
