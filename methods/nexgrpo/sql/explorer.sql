-- What NexGRPO adds to the trajectory explorer (reflexdb/explorer; docs/explorer.md, "What a method adds").
-- Parameters: %(id)s, %(run_id)s (the trajectory), %(parent)s, %(group_id)s, %(task_id)s.
-- A replayed copy and its stored source are each other's parent and child (reflexdb's own links).

-- name: links
-- A stored row -> the replay groups that took it as y+ or b*; a replay group's row -> the request.
SELECT CASE WHEN r.negative_id = %(id)s THEN 'replayed as the boundary failure b* in' ELSE 'replayed as the positive y+ in' END
           AS relation,
       'group' AS target, r.group_id::text AS target_id, 'group #' || r.group_id AS label
FROM replay_requests r
WHERE r.run_id = %(run_id)s AND (r.negative_id = %(id)s OR r.positive_id = %(id)s) AND r.group_id IS NOT NULL
ORDER BY r.id;

-- name: panels
-- The replay request a replay group fulfilled (shown on each of its rows).
SELECT 'NexGRPO replay request #' || r.id AS title, x.name, x.value, x.style
FROM replay_requests r
CROSS JOIN LATERAL (VALUES
    (1, 'positive y+', '#' || r.positive_id, 'text'),
    (2, 'boundary failure b*', '#' || r.negative_id, 'text'),
    (3, 'cos(φ(y+), φ(b*))', round(r.cosine::numeric, 4)::text, 'text'),
    (4, 'b* confidence (stored / refreshed)', coalesce(round(r.negative_confidence::numeric, 4)::text, '—') || ' / ' ||
                                            coalesce(round(r.refreshed_confidence::numeric, 4)::text, '—'), 'text'),
    (5, 'requested at learner step', r.learner_step::text || ' (v' || r.learner_version || ')', 'text')) AS x(n, name, value, style)
WHERE r.group_id = %(group_id)s
ORDER BY r.id, x.n;
