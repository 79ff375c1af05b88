-- `reflexdb runs`: what each run holds (reflexdb/cli/runs.py), loaded by name.

-- name: list_runs
-- One row per run (all runs, or the one named by :name when it is not NULL). groups counts its
-- training groups: of a kind the learner trains (table group_kinds, column trained). size_bytes is the
-- disk size of the run's partitions (trajectories, turns, token_bytes, embeddings, consumption;
-- indexes and TOAST included), read from the catalog: nothing is scanned. Held-out pass@1 is the mean
-- correctness of the run's eval groups on eval-split tasks with one attempt (`reflexdb eval`,
-- `reflexdb run`) at the first and the last policy version evaluated.
WITH per_run AS (
    SELECT r.id, r.name, r.algorithm, r.created_at, r.config,
           (SELECT max(s.step) FROM learner_steps s WHERE s.run_id = r.id) AS steps,
           (SELECT max(p.version) FROM policy_versions p WHERE p.run_id = r.id) AS latest_version,
           (SELECT count(*) FROM trajectories t WHERE t.run_id = r.id) AS trajectories,
           (SELECT count(*) FROM groups g JOIN group_kinds k ON k.name = g.kind
            WHERE g.run_id = r.id AND k.trained) AS groups,
           (SELECT max(t.created_at) FROM trajectories t WHERE t.run_id = r.id) AS last_write
    FROM runs r
    WHERE %(name)s::text IS NULL OR r.name = %(name)s::text
), evals AS (
    SELECT g.run_id, g.policy_version, avg(t.correct::int) AS pass_at_1, count(*) AS samples
    FROM groups g JOIN tasks k ON k.id = g.task_id JOIN trajectories t ON t.group_id = g.id
    WHERE g.kind = 'eval' AND k.split = 'eval' AND coalesce((g.meta ->> 'attempts')::int, 1) = 1
      AND g.run_id IN (SELECT id FROM per_run)
    GROUP BY 1, 2
)
SELECT r.id, r.name, r.algorithm, r.created_at, r.steps, r.latest_version, r.trajectories, r.groups, r.last_write,
       run_partitions_size(r.id) AS size_bytes,
       (SELECT e.policy_version FROM evals e WHERE e.run_id = r.id ORDER BY e.policy_version LIMIT 1) AS first_version,
       (SELECT e.pass_at_1 FROM evals e WHERE e.run_id = r.id ORDER BY e.policy_version LIMIT 1) AS first_pass_at_1,
       (SELECT e.policy_version FROM evals e WHERE e.run_id = r.id ORDER BY e.policy_version DESC LIMIT 1)
           AS last_version,
       (SELECT e.pass_at_1 FROM evals e WHERE e.run_id = r.id ORDER BY e.policy_version DESC LIMIT 1) AS last_pass_at_1,
       r.config
FROM per_run r
ORDER BY r.id;

-- name: run_evals
-- Held-out pass@1 of a run by policy version and attempts (`reflexdb eval --attempts K`): every
-- evaluation of eval-split tasks, its samples pooled when a version was evaluated more than once;
-- with the learner step of the version (version 0: step 0), where the learner's MLflow run logs it.
SELECT e.policy_version, e.attempts, e.pass_at_1, e.samples, e.tasks, e.at, coalesce(p.step, 0) AS step
FROM (SELECT g.policy_version, coalesce((g.meta ->> 'attempts')::int, 1) AS attempts,
             avg(t.correct::int) AS pass_at_1, count(*) AS samples, count(DISTINCT g.task_id) AS tasks,
             max(t.created_at) AS at
      FROM groups g JOIN tasks k ON k.id = g.task_id JOIN trajectories t ON t.group_id = g.id
      WHERE g.run_id = %(run_id)s AND g.kind = 'eval' AND k.split = 'eval'
      GROUP BY 1, 2) e
LEFT JOIN policy_versions p ON p.run_id = %(run_id)s AND p.version = e.policy_version
ORDER BY 1, 2;

-- name: run_origins
-- A run's trajectories by origin and group kind.
SELECT g.kind, t.origin, count(*) AS trajectories, avg(t.reward) AS mean_reward
FROM trajectories t JOIN groups g ON g.id = t.group_id
WHERE t.run_id = %(run_id)s
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: run_processes
-- Live database sessions of a run's processes (collect, learn, eval, import name themselves in
-- application_name: `reflexdb <role> <run>`), and collectors whose heartbeat is recent.
SELECT 'session' AS kind, a.application_name AS who, a.client_addr::text AS host, a.pid::text AS pid
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid()
  AND a.application_name IN (SELECT left('reflexdb ' || role || ' ' || %(name)s::text, 63)
                             FROM unnest(ARRAY['collect', 'learn', 'eval', 'import']) role)
UNION ALL
SELECT 'collector', c.name, c.host, c.pid::text
FROM collectors c JOIN runs r ON r.id = c.run_id
WHERE r.name = %(name)s::text AND c.status = 'running' AND c.last_seen > now() - interval '2 minutes';

-- name: delete_run
-- Every row of the run: its partitions dropped, then the runs row, whose foreign keys delete its
-- tasks, groups, steps, versions, collectors, ... (sql/functions/drop_run_partitions.sql).
SELECT drop_run_partitions(%(run_id)s);

-- name: run_owner
-- A run's name and creation time: with its id, who owns a checkpoint prefix (reflexdb/storage.py,
-- Owner; the marker reflexdb-run.json at the top of the run's prefix says the same).
SELECT name, created_at FROM runs WHERE id = %(run_id)s;

-- name: run_published
-- What the learner recorded as published for a run, version by version: the URI collectors read,
-- the weights' sha256, and its meta (stored_at: where it was uploaded, when collectors read it by
-- another URL; learner_state and state_tag: its learner state). `reflexdb runs delete` deletes only
-- what these name (reflexdb/ops/published.py), never what the run's config names.
SELECT version, checkpoint_uri, sha256, meta FROM policy_versions WHERE run_id = %(run_id)s ORDER BY version;

-- name: find_run
-- A run by name and its embedding dimension (NULL: not recorded yet). A collector whose login may
-- neither create runs nor record the dimension (the collector role) waits until both exist.
SELECT id, embedding_dim FROM runs WHERE name = %(name)s;

-- name: run_privileges
-- Whether this login may create a run and record its embedding dimension (the collector role may not).
SELECT has_column_privilege('runs', 'name', 'INSERT'), has_column_privilege('runs', 'embedding_dim', 'UPDATE');

-- name: run_sizes
-- Disk size of each run's partitions (`reflexdb db status`), largest first.
SELECT r.name, r.id, run_partitions_size(r.id) AS bytes,
       (SELECT count(*) FROM trajectories t WHERE t.run_id = r.id) AS trajectories
FROM runs r ORDER BY 3 DESC, 1;

-- name: runs_holding
-- The runs whose rows use the origins %(origins)s or the group kinds %(kinds)s (text arrays), or
-- another origin or group kind of the same method (a method's migration branch removes them all when
-- it is downgraded to base): one row per run, its name, what it uses ('origin NAME', 'group kind
-- NAME') and the methods of those. `reflexdb db downgrade` names them when their rows keep it from
-- removing an origin or a kind (reflexdb/migrate.py).
WITH named AS (
    SELECT method FROM origins WHERE name = ANY(%(origins)s::text[])
    UNION SELECT method FROM group_kinds WHERE name = ANY(%(kinds)s::text[])
), o AS (
    SELECT name, method FROM origins
    WHERE name = ANY(%(origins)s::text[]) OR method IN (SELECT method FROM named)
), k AS (
    SELECT name, method FROM group_kinds
    WHERE name = ANY(%(kinds)s::text[]) OR method IN (SELECT method FROM named)
), used AS (
    SELECT DISTINCT t.run_id, 'origin ' || o.name AS what, o.method
    FROM trajectories t JOIN o ON o.name = t.origin
    UNION
    SELECT DISTINCT g.run_id, 'group kind ' || k.name, k.method
    FROM groups g JOIN k ON k.name = g.kind
)
SELECT r.name, array_agg(DISTINCT u.what ORDER BY u.what) AS uses,
       array_remove(array_agg(DISTINCT u.method), NULL) AS methods
FROM used u JOIN runs r ON r.id = u.run_id
GROUP BY r.id, r.name
ORDER BY r.id;
