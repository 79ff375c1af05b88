-- Queries of NexGRPO's replay protocol (reflexdb.replay), loaded by name. The learner posts
-- replay requests; collectors claim them like tasks (FOR UPDATE SKIP LOCKED, with a TTL) and
-- complete each in the transaction that writes its replay group.

-- name: insert_request
-- Post one replay request (the learner's plan for one replay task).
INSERT INTO replay_requests (run_id, task_id, positive_id, negative_id, cosine, negative_confidence,
                             refreshed_confidence, discarded, group_size, learner_step, learner_version)
VALUES (%(run_id)s, %(task_id)s, %(positive_id)s, %(negative_id)s, %(cosine)s, %(negative_confidence)s,
        %(refreshed_confidence)s, %(discarded)s, %(group_size)s, %(learner_step)s, %(learner_version)s)
RETURNING id;

-- name: claim_requests
-- Claim up to n pending replay requests (oldest first) for one collector; a claim older than the
-- TTL is taken as abandoned by a dead collector. Returns what the collector needs to fill them.
WITH c AS (
    SELECT id FROM replay_requests
    WHERE run_id = %(run_id)s
      AND (status = 'pending'
           OR (status = 'claimed' AND claimed_at < now() - make_interval(secs => %(ttl)s)))
    ORDER BY id
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
)
UPDATE replay_requests r SET status = 'claimed', claimed_by = %(collector)s, claimed_at = now()
FROM c, tasks k
WHERE r.id = c.id AND k.id = r.task_id
RETURNING r.id, r.run_id, r.task_id, r.positive_id, r.negative_id, r.cosine, r.group_size,
          r.learner_step, r.learner_version, k.prompt, k.ground_truth, k.meta;

-- name: release_requests
-- Give back a collector's claimed requests (shutdown, abandoned group).
UPDATE replay_requests SET status = 'pending', claimed_by = NULL, claimed_at = NULL
WHERE run_id = %(run_id)s AND claimed_by = %(collector)s AND status = 'claimed';

-- name: cancel_request
-- A request that cannot be filled (its anchor or boundary failure is gone).
UPDATE replay_requests SET status = 'cancelled', completed_at = now()
WHERE id = %(id)s AND status IN ('pending', 'claimed');

-- name: cancel_stale_requests
-- Cancel pending requests planned under a policy older than min_version: their confidence refresh
-- is out of date (the learner plans them again with its current weights).
UPDATE replay_requests SET status = 'cancelled', completed_at = now()
WHERE run_id = %(run_id)s AND status = 'pending' AND learner_version < %(min_version)s;

-- name: outstanding
-- Replay work not yet trained on: requests pending or claimed (and their tasks), and replay
-- groups the learner may still consume.
SELECT
    (SELECT count(*) FROM replay_requests WHERE run_id = %(run_id)s AND status IN ('pending', 'claimed')),
    (SELECT count(*) FROM learner_eligible WHERE run_id = %(run_id)s AND kind = 'replay' AND eligible),
    (SELECT coalesce(array_agg(task_id), '{}'::int8[]) FROM replay_requests
      WHERE run_id = %(run_id)s AND status IN ('pending', 'claimed'));

-- name: candidates
-- The experience pool E of a run's train split: replayable tasks, their bucket and weight.
SELECT task_id, k, n, weight, n_positive, n_negative
FROM nexgrpo_replay_candidates
WHERE run_id = %(run_id)s AND split = %(split)s
ORDER BY task_id;

-- name: positive_ids
-- A task's positive pool, members with an embedding (anchors y+ are drawn from these).
SELECT trajectory_id FROM nexgrpo_positive_pool
WHERE task_id = %(task_id)s AND has_embedding ORDER BY trajectory_id;

-- name: negative_ids
-- A task's negative pool, members with an embedding (b* is searched among these).
SELECT trajectory_id FROM nexgrpo_negative_pool
WHERE task_id = %(task_id)s AND has_embedding ORDER BY trajectory_id;

-- name: retired_count
-- How many of a run's tasks in a split are retired (nexgrpo_retired_tasks).
SELECT count(*) FROM nexgrpo_retired_tasks WHERE run_id = %(run_id)s AND split = %(split)s;

-- name: complete_request
-- A replay group was written (same transaction): mark its NexGRPO replay request done. No row
-- comes back when the request is no longer the writer's (claim expired and taken by another
-- collector, or cancelled): the store then rolls the write back.
UPDATE replay_requests
SET status = 'done', group_id = %(group_id)s, completed_at = now(),
    claimed_by = coalesce(claimed_by, %(collector)s::text)
WHERE id = %(id)s AND status IN ('pending', 'claimed')
  AND (%(collector)s::text IS NULL OR claimed_by IS NULL OR claimed_by = %(collector)s::text)
RETURNING id;

-- name: claimed_by_others
-- Requests other collectors hold live claims on (a claim older than the TTL is abandoned): the
-- replay groups in flight that admission control counts (reflexdb.work.admission's in_flight).
SELECT count(*) FROM replay_requests
WHERE run_id = %(run_id)s AND status = 'claimed' AND claimed_by <> %(collector)s
  AND claimed_at >= now() - make_interval(secs => %(ttl)s);

-- name: eligible_groups_with_replay
-- NexGRPO's batch candidates: the oldest max_replay eligible replay groups and the oldest n
-- others, ranked separately (a replay group is found however many fresh groups are ahead of it),
-- with their kinds and the statement's snapshot.
SELECT array_agg(group_id ORDER BY group_id), array_agg(kind ORDER BY group_id), pg_current_snapshot()::text
FROM (SELECT group_id, kind, row_number() OVER (PARTITION BY kind = 'replay' ORDER BY group_id) AS rank
      FROM learner_eligible
      WHERE run_id = %(run_id)s AND eligible AND policy_version >= %(min_version)s
        AND kind <> 'imported') ranked
WHERE rank <= CASE WHEN kind = 'replay' THEN %(max_replay)s ELSE %(n)s END;
