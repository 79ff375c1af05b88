-- Queries of the collector's work protocol (reflexdb.work), loaded by name.

-- name: claim_tasks
-- Claim up to n tasks of a run for one collector: the least-collected first (epochs; a turn a
-- retired task was passed over by soft retirement counts as its turn), in a pseudo-random order
-- within an epoch, skipping tasks another collector holds (SKIP LOCKED never waits; a claim
-- older than the TTL is treated as abandoned by a dead collector). retired is looked up for the
-- claimed rows only, and only under soft retirement: {retired} is then the view that lists the
-- retired tasks (column task_id) of the method that asks for it (reflexdb.work.claim_tasks).
WITH c AS (
    SELECT id FROM tasks
    WHERE run_id = %(run_id)s AND split = %(split)s
      AND times_collected < %(max_collections)s
      AND (claimed_by IS NULL OR claimed_at < now() - make_interval(secs => %(ttl)s))
    ORDER BY times_collected + times_passed,
             hashtext(id::text || ':' || (times_collected + times_passed)::text), id
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
)
UPDATE tasks t SET claimed_by = %(collector)s, claimed_at = now()
FROM c WHERE t.id = c.id
RETURNING t.id, t.dataset, t.split, t.task_key, t.prompt, t.ground_truth, t.meta, t.times_collected,
          (%(soft_retirement)s AND EXISTS (SELECT 1 FROM {retired} v WHERE v.task_id = t.id));

-- name: pass_tasks
-- Soft retirement: the draw passed over these claimed retired tasks; release them and count the
-- turn (they move to the next epoch without being collected).
UPDATE tasks SET claimed_by = NULL, claimed_at = NULL, times_passed = times_passed + 1
WHERE id = ANY(%(ids)s) AND claimed_by = %(collector)s;

-- name: release_claims
-- Give back a collector's claims without counting a collection (shutdown, abandoned group).
UPDATE tasks SET claimed_by = NULL, claimed_at = NULL
WHERE run_id = %(run_id)s AND claimed_by = %(collector)s;

-- name: register_collector
-- Register (or re-register after a restart) a collector process under its name.
INSERT INTO collectors (run_id, name, host, pid, engine, model, policy_version)
VALUES (%(run_id)s, %(name)s, %(host)s, %(pid)s, %(engine)s, %(model)s, %(policy_version)s)
ON CONFLICT (run_id, name) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, engine = EXCLUDED.engine, model = EXCLUDED.model,
    policy_version = EXCLUDED.policy_version, status = 'running', started_at = now(),
    last_seen = now(), stopped_at = NULL
RETURNING id;

-- name: collector_progress
-- Heartbeat: add this interval's counts to a collector's statistics.
UPDATE collectors
SET last_seen = now(), policy_version = %(policy_version)s,
    groups_written = groups_written + %(groups)s,
    trajectories_written = trajectories_written + %(trajectories)s,
    tokens_generated = tokens_generated + %(tokens)s,
    reward_errors = reward_errors + %(reward_errors)s,
    unverified_rewards = unverified_rewards + %(unverified_rewards)s,
    skipped_rows = skipped_rows + %(skipped_rows)s,
    phase_seconds = coalesce(%(phase_seconds)s::jsonb, phase_seconds)
WHERE id = %(id)s;

-- name: collector_rejected
-- The store refused a group of this collector's for its content: count it, keep the reason.
UPDATE collectors
SET last_seen = now(), rejected_groups = rejected_groups + 1, last_rejection = %(reason)s
WHERE id = %(id)s;

-- name: collector_stopped
-- Mark a collector as stopped (clean exit) or failed.
UPDATE collectors SET status = %(status)s, stopped_at = now(), last_seen = now() WHERE id = %(id)s;

-- name: produced_groups
-- Groups the collectors produce for the learner (kinds that hold the policy's rollouts of a task,
-- group_kinds.rollouts: fresh and replay) written so far for a run, except those the run's method
-- never trains ({drops}: the view its Method.drops names, column group_id; none otherwise), plus
-- the ones other collectors hold task claims for (in flight): the admission check counts both,
-- and the claims of other work a method's workflow counts itself (reflexdb.work.admission's
-- in_flight).
SELECT
    (SELECT count(*) FROM groups g WHERE g.run_id = %(run_id)s
       AND g.kind IN (SELECT name FROM group_kinds WHERE rollouts)
       AND NOT EXISTS (SELECT 1 FROM {drops} d WHERE d.group_id = g.id)),
    (SELECT count(*) FROM tasks WHERE run_id = %(run_id)s AND claimed_by IS NOT NULL
       AND claimed_by <> %(collector)s AND claimed_at >= now() - make_interval(secs => %(ttl)s));

-- name: imported_share
-- Admission with learner.imported_per_step > 0: the learner's steps so far, the groups of rollouts
-- they consumed (group_kinds.rollouts), and how many more uses the eligible imported groups have left (each up to
-- learner.max_reuse steps; view learner_eligible).
SELECT
    (SELECT coalesce(max(step), 0) FROM learner_steps WHERE run_id = %(run_id)s),
    (SELECT count(DISTINCT c.group_id) FROM consumption c JOIN groups g ON g.id = c.group_id
      WHERE g.run_id = %(run_id)s AND g.kind IN (SELECT name FROM group_kinds WHERE rollouts)),
    (SELECT coalesce(sum(greatest(0, run_setting(run_id, 'learner.max_reuse', '1')::int - times_consumed)), 0)
       FROM learner_eligible WHERE run_id = %(run_id)s AND kind = 'imported' AND eligible);

-- name: tasks_left
-- Train tasks of a run collected fewer than max_collections times.
SELECT count(*) FROM tasks WHERE run_id = %(run_id)s AND split = 'train' AND times_collected < %(max_collections)s;

-- name: split_tasks
-- A run's tasks of one split, oldest first (reflexdb eval's held-out problems).
SELECT id, prompt, ground_truth FROM tasks WHERE run_id = %(run_id)s AND split = %(split)s ORDER BY id LIMIT %(n)s;

-- name: complete_claims
-- A collector finished tasks: release its claims and count the collections (same transaction as
-- the groups, so a task is counted exactly when its group exists).
UPDATE tasks
SET claimed_by = NULL, claimed_at = NULL, times_collected = times_collected + 1
WHERE id = ANY(%(ids)s) AND claimed_by = %(collector)s;

-- name: collector_phases
-- Where a run's collectors spent their time (0026): each key of collectors.phase_seconds summed
-- over the run's collectors (each holds its cumulative totals), for the learner's MLflow metrics.
SELECT p.key, sum(p.value::double precision)
FROM collectors c, jsonb_each_text(c.phase_seconds) p
WHERE c.run_id = %(run_id)s
GROUP BY p.key;
