-- Queries of LTE's hint stages (reflexdb/lte.py; docs/lte.md), loaded by name.
-- Each block starts with "-- name: <name>" and a line saying what it does.

-- name: open_stages
-- Open a 'pending' hint stage for each none-pass group of the run in lte_hint_pool that has none,
-- was produced by a policy the learner may still train on and has not timed out.
INSERT INTO lte_stages (group_id, run_id)
SELECT p.group_id, p.run_id FROM lte_hint_pool p
WHERE p.run_id = %(run_id)s AND p.stage IS NULL AND p.policy_version >= %(min_version)s
  AND p.created_at > now() - make_interval(secs => %(timeout)s)
ON CONFLICT (group_id) DO NOTHING;

-- name: claim_stages
-- Claim up to n open stages (oldest group first) for one collector: pending ones, and claimed ones
-- whose claim is older than the TTL (a dead collector's); never one whose group timed out.
WITH c AS (
    SELECT s.group_id FROM lte_stages s JOIN groups g ON g.id = s.group_id
    WHERE s.run_id = %(run_id)s
      AND (s.status = 'pending' OR (s.status = 'claimed' AND s.claimed_at < now() - make_interval(secs => %(ttl)s)))
      AND g.created_at > now() - make_interval(secs => %(timeout)s)
    ORDER BY s.group_id
    LIMIT %(n)s
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE lte_stages s SET status = 'claimed', claimed_by = %(collector)s, claimed_at = now()
FROM c WHERE s.group_id = c.group_id
RETURNING s.group_id;

-- name: claimed_pool
-- What a collector needs for the stages it claimed: the pool rows of those groups.
SELECT group_id, run_id, task_id, prompt, ground_truth, policy_version, size, hint_kind, wrong_answers
FROM lte_hint_pool WHERE group_id = ANY(%(ids)s) ORDER BY group_id;

-- name: release_stages
-- Give back a collector's claimed stages (shutdown, abandoned work): pending again.
UPDATE lte_stages SET status = 'pending', claimed_by = NULL, claimed_at = NULL
WHERE run_id = %(run_id)s AND claimed_by = %(collector)s AND status = 'claimed';

-- name: release_some_stages
-- Give back some of a collector's claimed stages (groups that left the pool since the claim).
UPDATE lte_stages SET status = 'pending', claimed_by = NULL, claimed_at = NULL
WHERE run_id = %(run_id)s AND claimed_by = %(collector)s AND status = 'claimed' AND group_id = ANY(%(ids)s);

-- name: reserve_hint_id
-- An id for a hints row about to be written (its hinted trajectories refer to it).
SELECT nextval(pg_get_serial_sequence('hints', 'id'));

-- name: insert_hint
-- The hints row of a finished stage (hint mode), with its reserved id.
INSERT INTO hints (id, group_id, task_id, kind, wrong_answers, hinted_prompt)
VALUES (%(id)s, %(group_id)s, %(task_id)s, %(kind)s, %(wrong_answers)s, %(hinted_prompt)s);

-- name: complete_stage
-- A stage finished (same transaction as its hints row and LTE group). No row comes back when the
-- stage is no longer the writer's (claim expired and taken, or released to the learner): the
-- writer then rolls everything back.
UPDATE lte_stages
SET status = 'done', mode = %(mode)s, hint_id = %(hint_id)s, lte_group_id = %(lte_group_id)s,
    n_sampled = %(n_sampled)s, n_correct = %(n_correct)s, completed_at = now()
WHERE group_id = %(group_id)s AND status = 'claimed' AND claimed_by = %(collector)s
RETURNING group_id;

-- name: eligible_groups
-- LTE's batch: the n oldest eligible groups (view learner_eligible) that may train now, each with
-- its stage: 'train' (not a none-pass fresh group, or released), 'unsolved' (stage done, no extra
-- rollout correct: trained as it is unless train_unsolved is false), 'timed_out' (no stage result
-- within the timeout: the caller releases it before training it). Left out: 'waiting' (stage not
-- finished, within the timeout) and 'replaced' (its LTE group trains instead). Also the snapshot.
SELECT array_agg(group_id ORDER BY group_id), array_agg(stage ORDER BY group_id), pg_current_snapshot()::text
FROM (
    SELECT e.group_id, st.stage
    FROM learner_eligible e
    JOIN groups g ON g.id = e.group_id
    LEFT JOIN lte_stages s ON s.group_id = e.group_id
    CROSS JOIN LATERAL (
        SELECT CASE
            WHEN e.kind <> 'fresh' THEN 'train'
            WHEN s.status = 'done' AND s.lte_group_id IS NOT NULL THEN 'replaced'
            WHEN s.status = 'done' THEN 'unsolved'
            WHEN s.status = 'released' THEN 'train'
            WHEN EXISTS (SELECT 1 FROM trajectories t WHERE t.group_id = e.group_id
                         AND (t.correct OR t.reward IS NULL)) THEN 'train'
            WHEN g.created_at <= now() - make_interval(secs => %(timeout)s) THEN 'timed_out'
            ELSE 'waiting'
        END AS stage
    ) st
    WHERE e.run_id = %(run_id)s AND e.eligible AND e.policy_version >= %(min_version)s AND e.kind <> 'imported'
      AND (st.stage IN ('train', 'timed_out') OR (st.stage = 'unsolved' AND %(train_unsolved)s))
    ORDER BY e.group_id
    LIMIT %(n)s
) x;

-- name: release_to_learner
-- The learner takes timed-out groups as they are: mark their stages 'released' (opening one where
-- none exists). A stage that finished meanwhile ('done') stays; its group is not returned.
INSERT INTO lte_stages (group_id, run_id, status, completed_at)
SELECT unnest(CAST(%(ids)s AS bigint[])), %(run_id)s, 'released', now()
ON CONFLICT (group_id) DO UPDATE SET status = 'released', claimed_by = NULL, completed_at = now()
WHERE lte_stages.status <> 'done'
RETURNING group_id;

-- name: link_hinted_rows
-- The hint each hinted row of an LTE group was sampled under (LTE's table, revision lte_0001).
INSERT INTO trajectory_hints (trajectory_id, run_id, hint_id)
SELECT t.id, t.run_id, %(hint_id)s
FROM groups g JOIN trajectories t ON t.group_id = g.id AND t.run_id = g.run_id
WHERE g.id = %(lte_group_id)s AND t.origin = 'hinted';

-- name: stages_of_groups
-- The stages of a batch's groups (as the original, or as the LTE group trained instead), with the
-- hint kind and the stage latency (completion, or now, minus the original group's creation).
SELECT s.group_id, s.lte_group_id, s.status, s.mode, s.n_sampled, s.n_correct, h.kind,
       extract(epoch FROM coalesce(s.completed_at, now()) - g.created_at)::float8
FROM lte_stages s
JOIN groups g ON g.id = s.group_id
LEFT JOIN hints h ON h.id = s.hint_id
WHERE s.group_id = ANY(%(ids)s) OR s.lte_group_id = ANY(%(ids)s);
