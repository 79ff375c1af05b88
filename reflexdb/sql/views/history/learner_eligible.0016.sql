-- learner_eligible: which groups the learner may consume next, and why not when it may not.
--
-- Rules (ARCHITECTURE.md, async and staleness; Reverb's samples-per-insert vocabulary):
--   * staleness: a group produced by policy version v may be consumed while the learner's
--     version (the run's newest policy_versions row, 0 before the first) is at most
--     v + max_staleness;
--   * reuse: a group is consumed at most max_reuse times (the number of learner steps that took
--     any of its trajectories);
--   * fresh on-policy groups and replay groups are training data; eval groups never are, nor
--     are retry groups (kind 'retry': a method's auxiliary rows, e.g. R3L's reflections and guided
--     retries, which reach the learner through the method's own views, never as a group);
--   * imported groups (reflexdb import: another framework's rollouts, offline data) have no
--     behaviour policy and no version: no staleness rule, only reuse, and only while the run's
--     learner.imported_per_step is above 0 (the learner then mixes at most that many into a
--     step, with pi_old = its own weights). Their staleness column is NULL.
-- One row per group. eligible = the rules hold.
-- Columns: run_id, group_id, task_id, kind, policy_version, learner_version, staleness
-- (learner_version - policy_version; NULL for imported groups), times_consumed, eligible, reason
-- ('ok', 'stale', 'consumed', 'eval', 'auxiliary': a retry group, 'imported': imported and
-- learner.imported_per_step is 0),
-- created_at.
-- Settings read: learner.max_staleness (default 1), learner.max_reuse (default 1),
-- learner.imported_per_step (default 0), from run_settings (through the function run_setting).
-- Example: SELECT reason, count(*) FROM learner_eligible WHERE run_id = 1 GROUP BY reason;
CREATE OR REPLACE VIEW learner_eligible AS
WITH s AS (
    SELECT r.id AS run_id,
           run_setting(r.id, 'learner.max_staleness', '1')::int AS max_staleness,
           run_setting(r.id, 'learner.max_reuse', '1')::int AS max_reuse,
           run_setting(r.id, 'learner.imported_per_step', '0')::int AS imported_per_step,
           coalesce((SELECT max(version) FROM policy_versions WHERE run_id = r.id), 0) AS learner_version
    FROM runs r
)
SELECT
    g.run_id,
    g.id AS group_id,
    g.task_id,
    g.kind,
    g.policy_version,
    s.learner_version,
    CASE WHEN g.kind <> 'imported' THEN s.learner_version - g.policy_version END AS staleness,
    c.times_consumed,
    (CASE
        WHEN g.kind IN ('eval', 'retry') THEN false
        WHEN g.kind = 'imported' THEN s.imported_per_step > 0
        ELSE s.learner_version - g.policy_version <= s.max_staleness
     END AND c.times_consumed < s.max_reuse) AS eligible,
    CASE
        WHEN g.kind = 'eval' THEN 'eval'
        WHEN g.kind = 'retry' THEN 'auxiliary'
        WHEN g.kind = 'imported' AND s.imported_per_step <= 0 THEN 'imported'
        WHEN c.times_consumed >= s.max_reuse THEN 'consumed'
        WHEN g.kind <> 'imported' AND s.learner_version - g.policy_version > s.max_staleness THEN 'stale'
        ELSE 'ok'
    END AS reason,
    g.created_at
FROM groups g
JOIN s ON s.run_id = g.run_id
CROSS JOIN LATERAL (
    -- c.run_id: consumption is partitioned by run (0015); naming the run reads one partition
    SELECT count(DISTINCT c.step_id)::int AS times_consumed FROM consumption c
    WHERE c.group_id = g.id AND c.run_id = g.run_id
) c;
