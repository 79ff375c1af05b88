-- r3l_failure_notes: R3L's part of the composed view failure_notes: the root cause a reflection
-- found for a trajectory (view failures shows it as root_cause).
--
-- Question it answers: "what did R3L's reflection say went wrong in this trajectory?" One row per
-- reflected-on trajectory with a valid reflection: the latest one's root_cause_analysis (R3L's
-- branch, r3l_0002; failures read table reflections itself before revision 0021).
-- Columns: trajectory_id, run_id, root_cause.
-- Settings read: none.
-- Example: SELECT root_cause FROM r3l_failure_notes WHERE trajectory_id = 42;
CREATE OR REPLACE VIEW r3l_failure_notes AS
SELECT DISTINCT ON (f.trajectory_id, f.run_id) f.trajectory_id, f.run_id, f.root_cause
FROM reflections f
WHERE f.valid
ORDER BY f.trajectory_id, f.run_id, f.created_at DESC, f.id DESC;
