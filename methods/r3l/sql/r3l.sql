-- R3L's queries (reflexdb.r3l), loaded by name. The rules live in the r3l_* views.

-- name: reserve_reflection_ids
-- Ids for reflections rows about to be written (the retries and the reflection's own trajectory
-- refer to them in the same transaction; the reference is checked at commit).
SELECT nextval(pg_get_serial_sequence('reflections', 'id')) FROM generate_series(1, %(n)s);

-- name: insert_reflection
-- One reflection, after its exploration group (it refers to the base episode), with its reserved id.
INSERT INTO reflections (id, trajectory_id, raw_text, parsed, pivot, outcome, root_cause, valid, error,
                         decoding, policy_version, run_id)
VALUES (%(id)s, %(trajectory_id)s, %(raw_text)s, %(parsed)s, %(pivot)s, %(outcome)s, %(root_cause)s,
        %(valid)s, %(error)s, %(decoding)s, %(policy_version)s,
        (SELECT run_id FROM trajectories WHERE id = %(trajectory_id)s));

-- name: insert_trajectory_reflections
-- Which of a group's trajectories belong to which reflection (R3L's table, revision r3l_0001).
INSERT INTO trajectory_reflections (trajectory_id, run_id, reflection_id)
SELECT x.t, %(run_id)s, x.r FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(reflections)s AS bigint[])) AS x(t, r);

-- name: available_reflect_set
-- The oldest pairs of the reflect set the learner may still train on (r3l.sft_max_uses).
SELECT trajectory_id FROM r3l_reflect_set
WHERE run_id = %(run_id)s AND available ORDER BY trajectory_id LIMIT %(n)s;

-- name: available_retry_set
-- The oldest pairs of the retry set the learner may still train on (r3l.sft_max_uses).
SELECT trajectory_id FROM r3l_retry_set
WHERE run_id = %(run_id)s AND available ORDER BY trajectory_id LIMIT %(n)s;

-- name: reflections_of_groups
-- The reflections on the base episodes of some exploration groups (the learner's r3l/* metrics).
SELECT exploration_group_id, valid, outcome, pivot, retry_trajectory_id IS NOT NULL, base_reward, retry_reward
FROM r3l_reflections WHERE exploration_group_id = ANY(%(ids)s)
ORDER BY exploration_group_id, reflection_id;

-- name: set_sizes
-- How many pairs the reflect and retry sets hold, and how many are still available.
SELECT (SELECT count(*) FROM r3l_reflect_set WHERE run_id = %(run_id)s),
       (SELECT count(*) FROM r3l_retry_set WHERE run_id = %(run_id)s),
       (SELECT count(*) FROM r3l_reflect_set WHERE run_id = %(run_id)s AND available),
       (SELECT count(*) FROM r3l_retry_set WHERE run_id = %(run_id)s AND available);
