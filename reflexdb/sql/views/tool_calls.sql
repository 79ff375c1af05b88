-- tool_calls: every tool call a model made, one row per call, with what the sandbox measured.
--
-- Question it answers: "which calls failed, why, how long did they take, and what code ran?" A
-- tool turn (role 'tool') carries the sandbox's record of its call (turns.tool_call, written by
-- collector/sandbox.py's ToolResult.record; docs/sandbox.md). status is 'ok' only when the
-- program exited 0 within every limit; 'error' (a non-zero exit, an exception, a signal),
-- 'timeout' (the wall clock) or 'limit' (CPU time, memory, output, code size, file size; detail
-- says which). Tool turns written before revision 0017 have no record and are not listed.
-- Columns: run, run_id, task_id, group_id, trajectory_id, origin, policy_version, turn_index,
-- attempt, status, exit_code (NULL when the sandbox stopped the call), detail, wall_s, cpu_s (all
-- the call's processes), memory_peak_mb (everything the call held at once), output_bytes (what it
-- printed, before the cap), code_bytes, code_sha256 (the same code has the same hash across
-- episodes), tool_error (the turn counts as a failed call), call_text (the assistant turn whose
-- code ran), output (what the model was shown), created_at.
-- Settings read: none.
-- Example: SELECT status, detail, count(*), round(avg(wall_s)::numeric, 3) FROM tool_calls
--          WHERE run = 'arithmetic-cleaner' GROUP BY 1, 2 ORDER BY 3 DESC;
CREATE OR REPLACE VIEW tool_calls AS
SELECT
    r.name AS run,
    t.run_id,
    t.task_id,
    t.group_id,
    t.id AS trajectory_id,
    t.origin,
    t.policy_version,
    u.turn_index,
    u.attempt,
    u.tool_call ->> 'status' AS status,
    (u.tool_call ->> 'exit_code')::int AS exit_code,
    u.tool_call ->> 'detail' AS detail,
    (u.tool_call ->> 'wall_s')::float8 AS wall_s,
    (u.tool_call ->> 'cpu_s')::float8 AS cpu_s,
    (u.tool_call ->> 'memory_peak_mb')::float8 AS memory_peak_mb,
    (u.tool_call ->> 'output_bytes')::bigint AS output_bytes,
    (u.tool_call ->> 'code_bytes')::bigint AS code_bytes,
    u.tool_call ->> 'code_sha256' AS code_sha256,
    u.tool_error,
    (SELECT a.text FROM turns a
      WHERE a.trajectory_id = u.trajectory_id AND a.run_id = u.run_id AND a.turn_index = u.turn_index - 1
        AND a.role = 'assistant') AS call_text,
    u.text AS output,
    t.created_at
FROM turns u
JOIN trajectories t ON t.id = u.trajectory_id AND t.run_id = u.run_id
JOIN runs r ON r.id = t.run_id
WHERE u.tool_call IS NOT NULL;
