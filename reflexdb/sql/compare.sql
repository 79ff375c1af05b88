-- `reflexdb compare`: runs side by side (reflexdb/ops/compare.py), loaded by name.

-- name: compare_runs
-- The named runs: method, seed, learner steps, and wall clock: from the publication of policy v0
-- (the learner ready) to its last recorded step ("training s"), and from its first to its last
-- step.
SELECT r.id, r.name, r.algorithm, r.config ->> 'seed' AS seed, r.config,
       (SELECT max(s.step) FROM learner_steps s WHERE s.run_id = r.id) AS steps,
       extract(epoch FROM (SELECT max(s.created_at) FROM learner_steps s WHERE s.run_id = r.id)
                         - (SELECT p.created_at FROM policy_versions p WHERE p.run_id = r.id AND p.version = 0))
           AS training_s
FROM runs r
WHERE r.name = ANY(%(names)s::text[])
ORDER BY array_position(%(names)s::text[], r.name);

-- name: compare_evals
-- Held-out evaluations with one attempt on eval-split tasks (`reflexdb eval`, `reflexdb run`):
-- per run, policy version and task, the samples and how many were correct (pooled when a version
-- was evaluated more than once).
SELECT g.run_id, g.policy_version, g.task_id, count(*) AS samples, count(*) FILTER (WHERE t.correct) AS correct
FROM groups g JOIN tasks k ON k.id = g.task_id JOIN trajectories t ON t.group_id = g.id
WHERE g.kind = 'eval' AND k.split = 'eval' AND coalesce((g.meta ->> 'attempts')::int, 1) = 1
  AND g.run_id = ANY(%(ids)s::bigint[])
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;

-- name: compare_steps
-- Each run's learner steps: step, seconds since policy v0 was published, and the batch's mean
-- reward (the metric `reward/mean`, as the learner logged it).
SELECT s.run_id, s.step,
       extract(epoch FROM s.created_at - (SELECT p.created_at FROM policy_versions p
                                         WHERE p.run_id = s.run_id AND p.version = 0)) AS seconds,
       (s.metrics ->> 'reward/mean')::float AS reward_mean
FROM learner_steps s
WHERE s.run_id = ANY(%(ids)s::bigint[])
ORDER BY 1, 2;

-- name: compare_versions
-- Each run's published policy versions: seconds from policy v0's publication to each one's (the
-- training time behind a version's evaluation).
SELECT p.run_id, p.version,
       extract(epoch FROM p.created_at - (SELECT p0.created_at FROM policy_versions p0
                                         WHERE p0.run_id = p.run_id AND p0.version = 0)) AS seconds
FROM policy_versions p
WHERE p.run_id = ANY(%(ids)s::bigint[])
ORDER BY 1, 2;
