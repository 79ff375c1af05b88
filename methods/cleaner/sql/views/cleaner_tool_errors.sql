-- cleaner_tool_errors: tool use per trajectory, raw against purified.
--
-- Question it answers: "how often does the model's code fail, and what did rollback make of it?"
-- CLEANER (CLEANER.md Sec. 4; METHODS.md §5): a tool call whose execution failed (non-zero exit,
-- exception, signal, timeout, CPU, output or file limit: turns.tool_error) is rolled back when
-- the policy corrects it within K attempts; the purified trajectory (origin 'purified') is what
-- trains, its raw twin (origin 'raw', in the group of kind 'retry' written with it) keeps every
-- failed call and error as sampled. One row per trajectory of a training or eval group (raw twins
-- appear as raw_trajectory_id of their purified row): trajectories with no tool call count too.
-- Columns: trajectory_id, run_id, group_id, task_id, group_kind, origin, policy_version, reward,
-- correct, tool_calls, tool_errors (this row's tool turns and failed ones), raw_trajectory_id
-- (the raw twin of a purified row; the row itself otherwise), raw_tool_calls, raw_tool_errors
-- (the raw episode's: failed calls and failed corrections), rollbacks (failed calls SAAR tried to
-- roll back), recovered (corrected within K), shallow, deep (replacements by kind), saar (SAAR
-- applied to the episode: meta.saar; NULL when the workflow was not cleaner's), created_at.
-- Settings read: none.
-- Example: SELECT policy_version, avg(raw_tool_errors), avg(tool_errors), sum(recovered)::float /
--          nullif(sum(rollbacks), 0) AS recovery FROM cleaner_tool_errors WHERE run_id = 1 GROUP BY 1;
CREATE OR REPLACE VIEW cleaner_tool_errors AS
SELECT
    t.id AS trajectory_id,
    t.run_id,
    t.group_id,
    t.task_id,
    g.kind AS group_kind,
    t.origin,
    t.policy_version,
    t.reward,
    t.correct,
    own.tool_calls,
    own.tool_errors,
    CASE WHEN t.origin = 'purified' THEN t.parent_trajectory_id ELSE t.id END AS raw_trajectory_id,
    coalesce(raw.tool_calls, own.tool_calls) AS raw_tool_calls,
    coalesce(raw.tool_errors, own.tool_errors) AS raw_tool_errors,
    rb.rollbacks,
    rb.recovered,
    rb.shallow,
    rb.deep,
    (t.meta ->> 'saar')::boolean AS saar,
    t.created_at
FROM trajectories t
JOIN groups g ON g.id = t.group_id
CROSS JOIN LATERAL (
    SELECT count(*)::int AS tool_calls, count(*) FILTER (WHERE u.tool_error)::int AS tool_errors
    FROM turns u WHERE u.trajectory_id = t.id AND u.role = 'tool'
) own
LEFT JOIN LATERAL (
    SELECT count(*)::int AS tool_calls, count(*) FILTER (WHERE u.tool_error)::int AS tool_errors
    FROM turns u WHERE u.trajectory_id = t.parent_trajectory_id AND u.role = 'tool'
) raw ON t.origin = 'purified'
CROSS JOIN LATERAL (
    SELECT count(*)::int AS rollbacks, count(*) FILTER (WHERE p.recovered)::int AS recovered,
           count(*) FILTER (WHERE p.replacement = 'shallow')::int AS shallow,
           count(*) FILTER (WHERE p.replacement = 'deep')::int AS deep
    FROM purifications p WHERE p.trajectory_id = t.id
) rb
WHERE g.kind <> 'retry';
