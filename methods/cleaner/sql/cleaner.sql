-- CLEANER's queries (reflexdb.cleaner), loaded by name. The per-trajectory rule lives in the view
-- cleaner_tool_errors.

-- name: insert_purification
-- One rollback of a purified trajectory, after its group (it refers to the purified row).
INSERT INTO purifications (trajectory_id, turn_index, attempts, recovered, similarity, replacement, error_text,
                           error_status, failed_code, corrected_code, run_id)
VALUES (%(trajectory_id)s, %(turn_index)s, %(attempts)s, %(recovered)s, %(similarity)s, %(replacement)s,
        %(error_text)s, %(error_status)s, %(failed_code)s, %(corrected_code)s,
        (SELECT run_id FROM trajectories WHERE id = %(trajectory_id)s));
