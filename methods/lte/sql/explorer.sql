-- What LTE adds to the trajectory explorer (reflexdb/explorer; docs/explorer.md, "What a method adds").
-- Parameters: %(id)s, %(run_id)s (the trajectory), %(parent)s, %(group_id)s, %(task_id)s.

-- name: links
-- A hinted rollout -> the group whose wrong answers made its hint; a row of such a group -> the
-- hinted rollouts its group's hint produced.
SELECT 'hint #' || h.id || ' made from the wrong answers of' AS relation, 'group' AS target,
       h.group_id::text AS target_id, 'group #' || h.group_id AS label
FROM trajectory_hints th JOIN hints h ON h.id = th.hint_id
WHERE th.trajectory_id = %(id)s AND th.run_id = %(run_id)s
UNION ALL
(SELECT 'hinted rollout under hint #' || h.id || ' (from this group)', 'trajectory', th.trajectory_id::text,
        'hinted #' || th.trajectory_id
 FROM hints h JOIN trajectory_hints th ON th.hint_id = h.id
 WHERE h.group_id = %(group_id)s ORDER BY th.trajectory_id LIMIT 50);

-- name: panels
-- The hint a rollout was sampled under.
SELECT 'LTE hint #' || h.id AS title, x.name, x.value, x.style
FROM trajectory_hints th JOIN hints h ON h.id = th.hint_id
CROSS JOIN LATERAL (VALUES
    (1, 'kind', h.kind, 'text'),
    (2, 'wrong answers it names', array_to_string(h.wrong_answers, ' · '), 'text'),
    (3, 'hinted prompt (what the rollout was sampled under; stored with the plain prompt)', h.hinted_prompt, 'code'))
    AS x(n, name, value, style)
WHERE th.trajectory_id = %(id)s AND th.run_id = %(run_id)s
ORDER BY h.id, x.n;
