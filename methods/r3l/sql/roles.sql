-- r3l's grants to the reflexdb roles (reflexdb/roles.py runs the block "grants" after reflexdb's
-- own, reflexdb/sql/roles.sql, which says what each role may do). The learner and the reader read
-- every table already.

-- name: grants
-- Collectors write reflections and their links with the group.
GRANT SELECT, INSERT ON reflections, trajectory_reflections TO reflexdb_collector;
