-- lte's grants to the reflexdb roles (reflexdb/roles.py runs the block "grants" after reflexdb's
-- own, reflexdb/sql/roles.sql, which says what each role may do). The learner and the reader read
-- every table already.

-- name: grants
-- Collectors open, claim and complete hint stages and write hints with their links, and their
-- admission control reads the groups LTE never trains (lte_group_drops, Method.drops); the learner
-- releases timed-out stages.
GRANT SELECT ON lte_stages, lte_hint_pool, hints, trajectory_hints, lte_group_drops TO reflexdb_collector;
GRANT INSERT ON lte_stages, hints, trajectory_hints TO reflexdb_collector;
GRANT UPDATE (status, claimed_by, claimed_at, mode, hint_id, lte_group_id, n_sampled, n_correct, completed_at)
    ON lte_stages TO reflexdb_collector;
GRANT INSERT, UPDATE ON lte_stages TO reflexdb_learner;
