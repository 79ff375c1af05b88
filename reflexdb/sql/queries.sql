-- Hot queries of the store, loaded by name (reflexdb.sqlfile.load_queries). Each block starts
-- with "-- name: <name>" and a line saying what it does. Parameters use psycopg's %(name)s style.

-- name: insert_groups
-- Insert the groups of one write (one array element per group, in order), queue a NOTIFY per
-- group (delivered at commit) and reserve ids for their trajectories: one row per trajectory,
-- (the group's position in the arrays from 1, group id, trajectory id), ids increasing in a group.
WITH x AS (
    SELECT *
    FROM unnest(%(run_ids)s::int8[], %(task_ids)s::int8[], %(workflows)s::text[], %(kinds)s::text[],
                %(versions)s::int4[], %(sizes)s::int2[], %(collectors)s::text[], %(metas)s::jsonb[],
                %(keys)s::uuid[])
         WITH ORDINALITY AS x(run_id, task_id, workflow, kind, policy_version, size, collector, meta, write_key, k)
), g AS (
    INSERT INTO groups (run_id, task_id, workflow, kind, policy_version, size, collector, meta, write_key)
    SELECT run_id, task_id, workflow, kind, policy_version, size, collector, meta, write_key FROM x ORDER BY k
    RETURNING id, run_id, size
), n AS (
    SELECT count(pg_notify('reflexdb_groups', json_build_object('run_id', g.run_id, 'group_id', g.id)::text))
    FROM g
), r AS (  -- the identity assigns ids in the order the SELECT feeds the rows: k's order
    SELECT id, size, row_number() OVER (ORDER BY id) AS k FROM g
)
SELECT r.k, r.id, nextval(pg_get_serial_sequence('trajectories', 'id'))
FROM r CROSS JOIN n CROSS JOIN generate_series(1, r.size)
ORDER BY 1, 3;

-- name: groups_by_write_key
-- Groups an earlier attempt of a write committed (its acknowledgement lost), with their
-- trajectory ids in order.
SELECT g.write_key, g.id, array_agg(t.id ORDER BY t.index_in_group)
FROM groups g JOIN trajectories t ON t.group_id = g.id
WHERE g.write_key = ANY(%(keys)s)
GROUP BY g.write_key, g.id;

-- name: claim_embedding_dim
-- Fix a run's embedding dimension on its first vector (no row back when it was already set).
UPDATE runs SET embedding_dim = %(dim)s, embedding_model = %(model)s
WHERE id = %(run_id)s AND embedding_dim IS NULL
RETURNING embedding_dim;

-- name: run_embedding_dim
-- A run's embedding dimension. Its own statement, so READ COMMITTED takes a fresh snapshot and
-- sees a dimension another writer committed while claim_embedding_dim waited for the row lock.
SELECT embedding_dim FROM runs WHERE id = %(run_id)s;

-- name: existing_trajectories
-- Which of some trajectory ids exist (the store's check of lineage: parent_trajectory_id has no
-- foreign key since trajectories are partitioned by run).
SELECT id FROM trajectories WHERE id = ANY(%(ids)s);

-- name: select_groups
-- Groups by id.
SELECT id, run_id, task_id, workflow, kind, policy_version, size, collector, meta, created_at
FROM groups WHERE id = ANY(%(ids)s);

-- name: select_trajectories_of_groups
-- The trajectories of some groups (of runs %(runs)s: only their partitions are read), in group order.
SELECT id, group_id, run_id, task_id, index_in_group, origin, parent_trajectory_id,
       policy_version, reward, correct, truncated, finish_reason, extracted_answer,
       confidence, num_turns, response_length, times_sampled, error, meta, created_at
FROM trajectories WHERE group_id = ANY(%(ids)s) AND run_id = ANY(%(runs)s)
ORDER BY group_id, index_in_group;

-- name: select_trajectories
-- Trajectories by id.
SELECT id, group_id, run_id, task_id, index_in_group, origin, parent_trajectory_id,
       policy_version, reward, correct, truncated, finish_reason, extracted_answer,
       confidence, num_turns, response_length, times_sampled, error, meta, created_at
FROM trajectories WHERE id = ANY(%(ids)s);

-- name: select_payloads
-- Token payloads by trajectory id (of runs %(runs)s, for partition pruning): little-endian bytea,
-- one block per array (store.py reads them with numpy.frombuffer).
SELECT trajectory_id, prompt_ids, response_ids, logprobs, token_policy_versions, loss_mask
FROM token_bytes WHERE trajectory_id = ANY(%(ids)s) AND run_id = ANY(%(runs)s);

-- name: select_embeddings
-- Embedding vectors by trajectory id, of runs %(runs)s (binary cursor).
SELECT trajectory_id, vector FROM embeddings WHERE trajectory_id = ANY(%(ids)s) AND run_id = ANY(%(runs)s);

-- name: select_turns
-- Turns by trajectory id, in order.
SELECT trajectory_id, turn_index, role, text, token_start, token_end, trainable, tool_error,
       attempt, answer, correct, reward, tool_call
FROM turns WHERE trajectory_id = ANY(%(ids)s) AND run_id = ANY(%(runs)s)
ORDER BY trajectory_id, turn_index;

-- name: eligible_groups
-- The learner's batch: the n oldest eligible groups of a run (view learner_eligible), and the
-- snapshot this statement saw (recorded with the step; view untrained_groups). min_version (the
-- learner's version minus max_staleness) only narrows the scan to the staleness window. Imported
-- groups come only through eligible_imported_groups (at most learner.imported_per_step a step).
-- {drops}: the groups the run's method never trains (the view its Method.drops names, column
-- group_id; an empty relation otherwise), left out.
SELECT array_agg(group_id ORDER BY group_id), pg_current_snapshot()::text
FROM (SELECT e.group_id FROM learner_eligible e
      WHERE e.run_id = %(run_id)s AND e.eligible AND e.policy_version >= %(min_version)s AND e.kind <> 'imported'
        AND NOT EXISTS (SELECT 1 FROM {drops} d WHERE d.group_id = e.group_id)
      ORDER BY e.group_id LIMIT %(n)s) x;

-- name: eligible_imported_groups
-- The n oldest eligible imported groups of a run (reflexdb import; view learner_eligible: no
-- staleness rule, at most max_reuse steps each, only while learner.imported_per_step > 0).
SELECT coalesce(array_agg(group_id ORDER BY group_id), '{}')
FROM (SELECT group_id FROM learner_eligible
      WHERE run_id = %(run_id)s AND kind = 'imported' AND eligible
      ORDER BY group_id LIMIT %(n)s) x;

-- name: groups_after
-- Ids of a run's groups newer than a given id (the learner's wake-up check).
SELECT id FROM groups WHERE run_id = %(run_id)s AND id > %(after)s ORDER BY id LIMIT %(limit)s;

-- name: newest_group
-- The id of a run's newest group (0: none): what the learner's wait for newer groups starts from.
SELECT coalesce(max(id), 0) FROM groups WHERE run_id = %(run_id)s;

-- name: latest_policy
-- The newest policy version of a run.
SELECT run_id, version, checkpoint_uri, sha256, step, meta, created_at, manifest_sha256
FROM policy_versions WHERE run_id = %(run_id)s ORDER BY version DESC LIMIT 1;

-- name: latest_state_policy
-- The newest policy version of a run that has a learner state (where resume starts).
SELECT run_id, version, checkpoint_uri, sha256, step, meta, created_at, manifest_sha256
FROM policy_versions WHERE run_id = %(run_id)s AND meta ? 'learner_state' ORDER BY version DESC LIMIT 1;

-- name: insert_policy
-- Publish a policy version and wake the collectors (NOTIFY is delivered at commit).
WITH p AS (
    INSERT INTO policy_versions (run_id, version, checkpoint_uri, sha256, step, meta, manifest_sha256)
    VALUES (%(run_id)s, %(version)s, %(checkpoint_uri)s, %(sha256)s, %(step)s, %(meta)s, %(manifest_sha256)s)
    RETURNING run_id, version, checkpoint_uri, sha256, step, meta, created_at, manifest_sha256
), n AS (
    SELECT pg_notify('reflexdb_policy',
                     json_build_object('run_id', p.run_id, 'version', p.version)::text)
    FROM p
)
SELECT p.* FROM p, n;

-- name: record_step
-- Record a learner step and the trajectories it consumed; bump their times_sampled. Each row's
-- advantages after every stage come flat: %(adv_ids)s holds a trajectory id once per stage and
-- %(adv_values)s its values in stage order (NULL for a value that was not finite); a trajectory
-- not in %(adv_ids)s gets NULL advantages.
WITH s AS (
    INSERT INTO learner_steps (run_id, step, policy_version, loss, metrics, batch_snapshot, advantage_stages)
    VALUES (%(run_id)s, %(step)s, %(policy_version)s, %(loss)s, %(metrics)s, %(batch_snapshot)s,
            %(advantage_stages)s::text[])
    RETURNING id
), a AS (
    SELECT id, array_agg(v ORDER BY k) AS advantages
    FROM unnest(%(adv_ids)s::int8[], %(adv_values)s::real[]) WITH ORDINALITY AS x(id, v, k)
    GROUP BY id
), c AS (
    INSERT INTO consumption (step_id, trajectory_id, group_id, run_id, advantages)
    SELECT s.id, t.id, t.group_id, t.run_id, a.advantages
    FROM s CROSS JOIN trajectories t LEFT JOIN a ON a.id = t.id
    WHERE t.id = ANY(%(ids)s)
    RETURNING trajectory_id
), u AS (
    UPDATE trajectories SET times_sampled = times_sampled + 1
    WHERE id IN (SELECT trajectory_id FROM c)
    RETURNING id
)
SELECT s.id, (SELECT count(*) FROM u) FROM s;

-- name: record_token_signals
-- What step %(step_id)s's loss used at each token of the rows it consumed (revision 0028), one row
-- beside each consumption row (its run_id from there); the arrays come aligned with %(ids)s.
INSERT INTO token_signals (step_id, trajectory_id, run_id, advantage, log_ratio, clipped, entropy)
SELECT c.step_id, c.trajectory_id, c.run_id, x.advantage, x.log_ratio, x.clipped, x.entropy
FROM unnest(%(ids)s::int8[], %(advantage)s::bytea[], %(log_ratio)s::bytea[], %(clipped)s::bytea[],
            %(entropy)s::bytea[]) AS x(id, advantage, log_ratio, clipped, entropy)
JOIN consumption c ON c.step_id = %(step_id)s AND c.trajectory_id = x.id;

-- name: step_consumption
-- A recorded step's row id and the trajectory ids it consumed (is a retried record the same step?).
SELECT s.id, coalesce(array_agg(c.trajectory_id ORDER BY c.trajectory_id)
                      FILTER (WHERE c.trajectory_id IS NOT NULL), '{}')
FROM learner_steps s LEFT JOIN consumption c ON c.step_id = s.id
WHERE s.run_id = %(run_id)s AND s.step = %(step)s
GROUP BY s.id;

-- Learner steps after the fact, and learner states (trainer/checkpointer.py, a method's hooks).

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
-- Merge metrics computed after a step (a method's hooks) into its row.
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
