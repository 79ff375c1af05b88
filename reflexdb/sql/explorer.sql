-- The trajectory explorer's queries (reflexdb/explorer, `reflexdb ui`; docs/explorer.md).
-- Every value comes in as a parameter (%(name)s); the explorer runs them in read-only
-- transactions under the role reflexdb_reader. The list queries page by keyset (id < %(before)s,
-- newest first), never by OFFSET, so the hundredth page costs what the first does. A method adds
-- what it knows of a trajectory in its own <package>/sql/explorer.sql (blocks links, panels and
-- marks; docs/explorer.md, "What a method adds").

-- name: runs
-- Every run, newest first, with its size (exact up to 100,000 rows, the planner's estimate above).
SELECT r.id, r.name, r.algorithm, r.created_at, r.config ->> 'model' AS model,
       CASE WHEN coalesce(c.reltuples, 0) > 100000 THEN c.reltuples::bigint
            ELSE (SELECT count(*) FROM trajectories t WHERE t.run_id = r.id) END AS trajectories,
       coalesce(c.reltuples, 0) > 100000 AS estimated,
       (SELECT max(s.step) FROM learner_steps s WHERE s.run_id = r.id) AS last_step,
       (SELECT max(p.version) FROM policy_versions p WHERE p.run_id = r.id) AS last_version
FROM runs r LEFT JOIN pg_class c ON c.relname = 'trajectories_r' || r.id
ORDER BY r.id DESC;

-- name: run
SELECT r.id, r.name, r.algorithm, r.created_at, r.config, r.embedding_dim, r.embedding_model
FROM runs r WHERE r.name = %(name)s;

-- name: run_seen
-- What the filters of a run's lists offer, from its rows: the origins of its trajectories above id
-- %(after_trajectory)s, the kinds and workflows of its groups above id %(after_group)s, and the
-- newest ids. The explorer keeps what it read and asks only for the rows added since (explorer/
-- data.py, Explorer.choices): the first read scans the run (about 1 s at a million trajectories),
-- the later ones are a range of the id indexes.
SELECT (SELECT array_agg(DISTINCT t.origin) FROM trajectories t
        WHERE t.run_id = %(run_id)s AND t.id > %(after_trajectory)s) AS origins,
       (SELECT max(t.id) FROM trajectories t WHERE t.run_id = %(run_id)s) AS last_trajectory,
       (SELECT array_agg(DISTINCT g.kind) FROM groups g WHERE g.run_id = %(run_id)s AND g.id > %(after_group)s) AS kinds,
       (SELECT array_agg(DISTINCT g.workflow) FROM groups g
        WHERE g.run_id = %(run_id)s AND g.id > %(after_group)s) AS workflows,
       (SELECT max(g.id) FROM groups g WHERE g.run_id = %(run_id)s) AS last_group;

-- name: run_methods
-- The methods a run's method filter offers: those owning an origin or a group kind its rows have,
-- and the run's algorithm when it is a workflow of its groups.
SELECT array_agg(DISTINCT m ORDER BY m) AS methods FROM (
    SELECT method AS m FROM origins WHERE name = ANY(%(origins)s::text[])
    UNION SELECT method FROM group_kinds WHERE name = ANY(%(kinds)s::text[])
    UNION SELECT %(algorithm)s::text WHERE %(algorithm)s::text = ANY(%(workflows)s::text[])) x
WHERE m IS NOT NULL;

-- name: steps
-- A run's learner steps, newest first.
SELECT s.id, s.step, s.policy_version, s.loss, s.metrics, s.created_at, s.advantage_stages,
       (SELECT count(*) FROM consumption c WHERE c.step_id = s.id AND c.run_id = s.run_id) AS n_rows,
       (SELECT count(DISTINCT c.group_id) FROM consumption c WHERE c.step_id = s.id AND c.run_id = s.run_id) AS n_groups
FROM learner_steps s
WHERE s.run_id = %(run_id)s AND (%(before)s::int IS NULL OR s.step < %(before)s)
ORDER BY s.step DESC LIMIT %(limit)s;

-- name: step
SELECT s.id, s.step, s.policy_version, s.loss, s.metrics, s.created_at, s.batch_snapshot, s.advantage_stages,
       (SELECT max(s2.step) FROM learner_steps s2 WHERE s2.run_id = s.run_id AND s2.step < s.step) AS previous,
       (SELECT min(s2.step) FROM learner_steps s2 WHERE s2.run_id = s.run_id AND s2.step > s.step) AS next
FROM learner_steps s WHERE s.run_id = %(run_id)s AND s.step = %(step)s;

-- name: step_rows
-- The rows a step trained on, by group, with the advantage after each stage and the staleness; the
-- prompt cut as the grids cut it (explorer/tables.py: COMPLETION_CHARS + 1).
SELECT c.group_id, g.kind, g.workflow, g.policy_version AS group_version, t.id, t.index_in_group, t.origin,
       t.policy_version, t.reward, t.correct, t.confidence, t.response_length, t.extracted_answer, c.advantages,
       %(learner_version)s - t.policy_version AS staleness, left(k.prompt, 2001) AS prompt, t.task_id, t.error
FROM consumption c
JOIN trajectories t ON t.id = c.trajectory_id AND t.run_id = c.run_id
JOIN groups g ON g.id = c.group_id
JOIN tasks k ON k.id = t.task_id
WHERE c.step_id = %(step_id)s AND c.run_id = %(run_id)s
ORDER BY c.group_id, t.index_in_group;

-- name: group
SELECT g.id, g.run_id, r.name AS run, g.task_id, g.workflow, g.kind, g.policy_version, g.size, g.collector, g.meta,
       g.created_at, k.prompt, k.ground_truth, gk.summary AS kind_summary, gk.trained
FROM groups g JOIN runs r ON r.id = g.run_id JOIN tasks k ON k.id = g.task_id
JOIN group_kinds gk ON gk.name = g.kind
WHERE g.id = %(id)s;

-- name: group_rows
-- A group's rows and, for each, the newest step that trained it and the advantages it gave.
SELECT t.id, t.index_in_group, t.origin, t.policy_version, t.reward, t.correct, t.confidence, t.response_length,
       t.num_turns, t.extracted_answer, t.error, t.parent_trajectory_id, t.times_sampled, last.step, last.advantages
FROM trajectories t
LEFT JOIN LATERAL (
    SELECT s.step, c.advantages FROM consumption c JOIN learner_steps s ON s.id = c.step_id
    WHERE c.trajectory_id = t.id AND c.run_id = t.run_id ORDER BY s.step DESC LIMIT 1) last ON true
WHERE t.group_id = %(id)s AND t.run_id = %(run_id)s
ORDER BY t.index_in_group;

-- name: group_steps
SELECT s.step, s.advantage_stages, count(*) AS n_rows
FROM consumption c JOIN learner_steps s ON s.id = c.step_id
WHERE c.group_id = %(id)s AND c.run_id = %(run_id)s
GROUP BY s.step, s.advantage_stages ORDER BY s.step;

-- name: trajectory
SELECT t.id, t.run_id, r.name AS run, t.group_id, t.task_id, t.index_in_group, t.origin, t.parent_trajectory_id,
       t.policy_version, t.reward, t.correct, t.truncated, t.finish_reason, t.extracted_answer, t.confidence,
       t.num_turns, t.response_length, t.times_sampled, t.error, t.meta, t.created_at,
       g.kind, g.workflow, g.policy_version AS group_version, g.size AS group_size, g.collector,
       k.prompt, k.ground_truth, k.dataset, k.split, k.task_key,
       o.summary AS origin_summary, o.method AS origin_method, o.pi_old
FROM trajectories t
JOIN runs r ON r.id = t.run_id
JOIN groups g ON g.id = t.group_id
JOIN tasks k ON k.id = t.task_id
JOIN origins o ON o.name = t.origin
WHERE t.id = %(id)s;

-- name: turns
SELECT turn_index, role, text, token_start, token_end, trainable, tool_error, attempt, answer, correct, reward,
       tool_call
FROM turns WHERE trajectory_id = %(id)s AND run_id = %(run_id)s ORDER BY turn_index;

-- name: tokens
SELECT prompt_ids, response_ids, logprobs, token_policy_versions, loss_mask
FROM token_bytes WHERE trajectory_id = %(id)s AND run_id = %(run_id)s;

-- name: signal_steps
-- The learner steps that recorded what their loss used at each token of a trajectory (revision 0028).
SELECT s.step FROM token_signals g JOIN learner_steps s ON s.id = g.step_id
WHERE g.trajectory_id = %(id)s AND g.run_id = %(run_id)s ORDER BY s.step;

-- name: token_signals
-- A trajectory's per-token learner signals of step %(step)s: float16 and byte arrays (revision 0028).
SELECT g.advantage, g.log_ratio, g.clipped, g.entropy
FROM token_signals g JOIN learner_steps s ON s.id = g.step_id
WHERE g.trajectory_id = %(id)s AND g.run_id = %(run_id)s AND s.step = %(step)s;

-- name: trained_in
-- The steps that trained a trajectory, with the advantages each gave it.
SELECT s.step, s.policy_version, s.advantage_stages, c.advantages
FROM consumption c JOIN learner_steps s ON s.id = c.step_id
WHERE c.trajectory_id = %(id)s AND c.run_id = %(run_id)s ORDER BY s.step;

-- name: links
-- Lineage every trajectory has: its parent, the rows made from it, the file it was imported from.
-- Columns: relation, target ('trajectory', 'group', 'file'), target_id, label.
SELECT 'parent' AS relation, 'trajectory' AS target, p.id::text AS target_id,
       p.origin || ' #' || p.id AS label
FROM trajectories p WHERE p.id = %(parent)s
UNION ALL
SELECT 'made from it (' || c.origin || ')', 'trajectory', c.id::text, c.origin || ' #' || c.id
FROM trajectories c WHERE c.parent_trajectory_id = %(id)s AND c.run_id = %(run_id)s
UNION ALL
SELECT 'imported from', 'file', %(imported_from)s, %(imported_from)s || coalesce(', line ' || %(line)s, '')
WHERE %(imported_from)s::text IS NOT NULL;

-- name: task
SELECT k.id, k.run_id, k.prompt, k.ground_truth, k.dataset, k.split, k.task_key, k.times_collected
FROM tasks k WHERE k.id = %(id)s AND k.run_id = %(run_id)s;

-- name: task_versions
-- A task across policy versions: per version, its rows of the plain prompt (origins counted in pass@1).
SELECT t.policy_version, count(*) AS n, avg(t.reward) AS mean_reward,
       avg(t.correct::int) AS pass_rate, min(t.id) AS first_id, max(t.id) AS last_id
FROM trajectories t JOIN origins o ON o.name = t.origin
WHERE t.run_id = %(run_id)s AND t.task_id = %(id)s AND o.pass_at_1
GROUP BY t.policy_version ORDER BY t.policy_version;

-- name: answer
-- A row of a task at a version, with its assistant text (the compare page's two sides).
SELECT t.id, t.policy_version, t.reward, t.correct, t.extracted_answer, t.origin, t.created_at,
       (SELECT string_agg(u.text, E'\n' ORDER BY u.turn_index) FROM turns u
        WHERE u.trajectory_id = t.id AND u.run_id = t.run_id AND u.role = 'assistant') AS response
FROM trajectories t WHERE t.id = %(id)s AND t.run_id = %(run_id)s;

-- name: curve_steps
-- A run's learner steps for the run page's curves (explorer/charts.py), oldest first: every step
-- when the run has at most %(rows)s, else %(rows)s steps evenly spaced over its range, each found by
-- one probe of the index on (run_id, step), so a run of a million steps costs what one of
-- %(rows)s does (its steps are counted only up to %(rows)s + 1, and that count gates each branch
-- once; the LIMITs keep the planner's estimate, and so JIT, small). Reads learner_steps alone;
-- metrics as JSON text (the page parses it, integers as floats).
WITH r AS (SELECT (SELECT step FROM learner_steps WHERE run_id = %(run_id)s ORDER BY step LIMIT 1) AS lo,
                  (SELECT step FROM learner_steps WHERE run_id = %(run_id)s ORDER BY step DESC LIMIT 1) AS hi,
                  (SELECT count(*) FROM (SELECT 1 FROM learner_steps x WHERE x.run_id = %(run_id)s
                                         ORDER BY x.step LIMIT %(rows)s + 1) c) AS n)
(SELECT s.step, s.policy_version, s.loss, s.metrics::text AS metrics
 FROM learner_steps s
 WHERE s.run_id = %(run_id)s AND (SELECT n FROM r) <= %(rows)s ORDER BY s.step LIMIT %(rows)s)
UNION ALL
(SELECT DISTINCT ON (p.step) p.step, p.policy_version, p.loss, p.metrics::text
 FROM r CROSS JOIN generate_series(0, %(rows)s - 1) i
 CROSS JOIN LATERAL (SELECT s.step, s.policy_version, s.loss, s.metrics FROM learner_steps s
                     WHERE s.run_id = %(run_id)s
                       AND s.step >= r.lo + floor(i * (r.hi - r.lo)::float8 / (%(rows)s - 1))::bigint
                     ORDER BY s.step LIMIT 1) p
 WHERE (SELECT n FROM r) > %(rows)s ORDER BY p.step LIMIT %(rows)s)
ORDER BY step;

-- name: curve_mark
-- What a run's cached curves were drawn from (explorer/app.py): its steps counted up to %(rows)s + 1,
-- its first and last step, and the last step's row id and row version (xmin: a method's metrics
-- merged into the step after it was recorded change it). A few index probes.
SELECT (SELECT count(*) FROM (SELECT 1 FROM learner_steps x WHERE x.run_id = %(run_id)s
                              ORDER BY x.step LIMIT %(rows)s + 1) c) AS n,
       (SELECT step FROM learner_steps WHERE run_id = %(run_id)s ORDER BY step LIMIT 1) AS lo,
       l.step AS hi, l.id AS last_id, l.xmin::text AS last_xmin
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT s.step, s.id, s.xmin FROM learner_steps s WHERE s.run_id = %(run_id)s
                   ORDER BY s.step DESC LIMIT 1) l ON true;

-- name: curve_evaluations
-- A run's held-out evaluations by policy version (`reflexdb eval`, `reflexdb run`: groups of kind
-- eval on eval-split tasks): pass@1 per version and attempts, the samples pooled when a version
-- was evaluated more than once. An `attempts` that is not a small integer counts as 1.
SELECT g.policy_version,
       CASE WHEN g.meta ->> 'attempts' ~ '^[0-9]{1,6}$' THEN (g.meta ->> 'attempts')::int ELSE 1 END AS attempts,
       avg(t.correct::int)::float8 AS pass_at_1, count(*) AS samples, count(DISTINCT g.task_id) AS tasks
FROM groups g JOIN tasks k ON k.id = g.task_id
JOIN trajectories t ON t.group_id = g.id AND t.run_id = g.run_id
WHERE g.run_id = %(run_id)s AND g.kind = 'eval' AND k.split = 'eval'
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: run_names
-- The runs a run page offers to draw beside its own curves, newest first.
SELECT r.name FROM runs r ORDER BY r.id DESC LIMIT 500;

-- name: completions
-- What the grids (explorer/tables.py) show of each row's completion, its assistant turns, read
-- cut: the first assistant turn's first %(chars)s + 1 characters (the grid shows its first line),
-- the assistant turns in order, blank-line separated, from at most %(turns)s + 1 turns and cut at
-- %(chars)s + 1 characters, how many turns that read, and the size of all of them in bytes.
-- left() reads a slice of a long text and octet_length its stored size, neither the whole text:
-- a completion of a megabyte costs what one of a line does.
SELECT x.id, c.first_turn, c.text, c.turns,
       (SELECT sum(octet_length(u.text)) FROM turns u
        WHERE u.trajectory_id = x.id AND u.run_id = %(run_id)s AND u.role = 'assistant') AS bytes
FROM unnest(%(ids)s::bigint[]) AS x(id)
CROSS JOIN LATERAL (
    SELECT (array_agg(a.part ORDER BY a.turn_index))[1] AS first_turn,
           left(string_agg(a.part, E'\n\n' ORDER BY a.turn_index), %(chars)s + 1) AS text, count(*) AS turns
    FROM (SELECT u.turn_index, left(u.text, %(chars)s + 1) AS part FROM turns u
          WHERE u.trajectory_id = x.id AND u.run_id = %(run_id)s AND u.role = 'assistant'
          ORDER BY u.turn_index LIMIT %(turns)s + 1) a) c;

-- name: episode_turns
-- A trajectory's first %(limit)s turns for the side-by-side and trace pages: each text's first
-- %(chars)s characters and its whole length, its span of response tokens, its tool call's record.
SELECT turn_index, role, left(text, %(chars)s) AS text, length(text) AS chars, token_start, token_end, tool_error,
       attempt, answer, correct, reward, tool_call
FROM turns WHERE trajectory_id = %(id)s AND run_id = %(run_id)s ORDER BY turn_index LIMIT %(limit)s;

-- name: turn_totals
-- All of a trajectory's turns counted, and the sandbox time of its tool calls (turns.tool_call's
-- wall_s and cpu_s, collector/sandbox.py ToolResult.record): JSON numbers only, each clamped to
-- [0, 1e9] s, so that no stored record can fail the cast.
SELECT count(*) AS turns, count(tool_call) AS calls, count(*) FILTER (WHERE tool_error) AS errors,
       sum(CASE WHEN jsonb_typeof(tool_call -> 'wall_s') = 'number'
                THEN least(greatest((tool_call ->> 'wall_s')::numeric, 0), 1e9) END)::float8 AS wall_s,
       sum(CASE WHEN jsonb_typeof(tool_call -> 'cpu_s') = 'number'
                THEN least(greatest((tool_call ->> 'cpu_s')::numeric, 0), 1e9) END)::float8 AS cpu_s,
       count(*) FILTER (WHERE jsonb_typeof(tool_call -> 'wall_s') = 'number') AS timed
FROM turns WHERE trajectory_id = %(id)s AND run_id = %(run_id)s;
