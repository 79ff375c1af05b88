-- nexgrpo's grants to the reflexdb roles (reflexdb/roles.py runs the block "grants" after reflexdb's
-- own, reflexdb/sql/roles.sql, which says what each role may do). The learner and the reader read
-- every table already.

-- name: grants
-- Collectors claim and complete replay requests and skip retired tasks; the learner posts requests.
GRANT SELECT ON replay_requests, nexgrpo_retired_tasks TO reflexdb_collector;
GRANT UPDATE (status, claimed_by, claimed_at, group_id, completed_at) ON replay_requests TO reflexdb_collector;
GRANT INSERT, UPDATE ON replay_requests TO reflexdb_learner;
