-- cleaner's grants to the reflexdb roles (reflexdb/roles.py runs the block "grants" after reflexdb's
-- own, reflexdb/sql/roles.sql, which says what each role may do). The learner and the reader read
-- every table already.

-- name: grants
-- Collectors write the rollbacks of a purified trajectory with its group.
GRANT SELECT, INSERT ON purifications TO reflexdb_collector;
