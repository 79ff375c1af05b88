-- Queries of the learner (trainer/learner.py), loaded by name (reflexdb.sqlfile.load_queries).
-- Each block starts with "-- name: <name>" and a line saying what it does.

-- name: roll_back_consumption
-- Restore times_sampled of the trajectories consumed by a run's steps after %(step)s.
UPDATE trajectories t SET times_sampled = t.times_sampled - x.n
FROM (SELECT c.trajectory_id, count(*) AS n FROM consumption c
      JOIN learner_steps s ON s.id = c.step_id
      WHERE s.run_id = %(run_id)s AND s.step > %(step)s GROUP BY 1) x
WHERE t.id = x.trajectory_id;

-- name: delete_steps_after
-- Delete a run's steps after %(step)s (their consumption rows go with them).
DELETE FROM learner_steps WHERE run_id = %(run_id)s AND step > %(step)s;

-- name: recent_state_tags
-- The learner-state tags of a run's newest %(k)s published versions.
SELECT meta->>'state_tag' FROM policy_versions WHERE run_id = %(run_id)s AND meta ? 'state_tag'
ORDER BY version DESC LIMIT %(k)s;

-- name: add_step_metrics
-- Merge metrics computed after a step (e.g. NexGRPO's replay planning) into its row.
UPDATE learner_steps SET metrics = metrics || CAST(%(metrics)s AS jsonb)
WHERE run_id = %(run_id)s AND step = %(step)s;

-- name: any_step_metric_above
-- Whether any surviving step of a run has a metric above a threshold.
SELECT EXISTS (SELECT 1 FROM learner_steps WHERE run_id = %(run_id)s
               AND (metrics->>%(metric)s)::float8 > %(threshold)s);

-- name: attach_state
-- Record the learner state written for an already published version (a clean stop after a
-- publish without one, learner.state_every).
UPDATE policy_versions SET meta = meta || CAST(%(meta)s AS jsonb)
WHERE run_id = %(run_id)s AND version = %(version)s;
