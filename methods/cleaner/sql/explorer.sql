-- What CLEANER adds to the trajectory explorer (reflexdb/explorer; docs/explorer.md, "What a method adds").
-- Parameters: %(id)s, %(run_id)s (the trajectory), %(parent)s, %(group_id)s, %(task_id)s.
-- The raw and the purified row are each other's parent and child (reflexdb's own links).
--
-- A purifications row is a failed call SAAR tried to roll back (docs/cleaner.md). Recovered: a
-- correction ran, and the purified row's turn holds it in place of the failed call (shallow: the
-- turn's own reasoning with the corrected code; deep: the correction's whole turn). Not recovered:
-- all K corrections failed, so the purified row's turn IS the failed call, its error stays in the
-- next turn (with a note to try a different approach) and nothing later in the row is rolled
-- back. Either way the raw twin holds the failed call, its error and every correction as sampled.
-- The texts below say which, so the mark, the panel and the turns agree.

-- name: panels
-- Each rollback of a purified row (shown on it and on its raw twin): what the purified row holds
-- there, the failed call, the error it got and the correction (the one that replaced it, or the
-- last one tried).
SELECT 'CLEANER rollback at turn ' || p.turn_index || ' of purified #' || p.trajectory_id
           || CASE WHEN p.recovered THEN ': the failed call replaced'
                   ELSE ': not rolled back, every correction failed' END AS title,
       x.name, x.value, x.style
FROM purifications p
CROSS JOIN LATERAL (VALUES
    (1, 'what purified #' || p.trajectory_id || ' holds at turn ' || p.turn_index,
        CASE WHEN p.recovered THEN
            'a correction that ran, in place of the failed call (' || coalesce(p.replacement, '?') || ': '
            || CASE p.replacement WHEN 'shallow' THEN 'the turn''s own reasoning with the corrected code'
                                  ELSE 'the correction''s own turn' END
            || '); the failed call and its error are only in the raw twin'
        ELSE
            'the failed call itself, as sampled: ' || p.attempts || ' correction(s) failed too, so its error '
            || 'stays in the next turn (with a note to try a different approach) and nothing later in the row '
            || 'was rolled back; the corrections tried are in the raw twin'
        END, 'text'),
    (2, 'recovered', CASE WHEN p.recovered THEN 'yes: a correction ran' ELSE 'no: no correction ran' END, 'text'),
    (3, 'replacement', p.replacement, 'text'),
    (4, 'similarity', round(p.similarity::numeric, 3)::text, 'text'),
    (5, 'correction attempts', p.attempts::text, 'text'),
    (6, 'failed call', p.failed_code, 'code'),
    (7, 'its error (' || coalesce(p.error_status, 'error') || ')', p.error_text, 'error'),
    (8, CASE WHEN p.recovered THEN 'the correction that replaced it' ELSE 'the last correction tried (it failed too)' END,
        p.corrected_code, 'code')) AS x(n, name, value, style)
WHERE p.run_id = %(run_id)s
  AND (p.trajectory_id = %(id)s
       OR p.trajectory_id IN (SELECT c.id FROM trajectories c
                              WHERE c.parent_trajectory_id = %(id)s AND c.run_id = %(run_id)s))
ORDER BY p.trajectory_id, p.turn_index, x.n;

-- name: marks
-- On a purified row, the turn of each failed call SAAR tried to roll back: replaced (a correction
-- ran) or kept as sampled (every correction failed).
SELECT p.turn_index, NULL::int AS token,
       CASE WHEN p.recovered THEN
           'rolled back: this turn replaced a failed call (' || coalesce(p.error_status, 'error')
           || ') with a correction that ran (' || coalesce(p.replacement, '?') || '); the raw twin'
           || coalesce(' #' || %(parent)s::bigint, '') || ' keeps the failed call and its error'
       ELSE
           'not rolled back: this turn is the failed call as sampled (' || coalesce(p.error_status, 'error')
           || '); ' || p.attempts || ' correction(s) failed too, so its error stays in the next turn; the raw twin'
           || coalesce(' #' || %(parent)s::bigint, '') || ' holds the corrections tried'
       END AS label,
       CASE WHEN p.recovered THEN 'rollback' ELSE 'warn' END AS style
FROM purifications p
WHERE p.trajectory_id = %(id)s AND p.run_id = %(run_id)s;
