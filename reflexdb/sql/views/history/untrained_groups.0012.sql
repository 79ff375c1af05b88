-- untrained_groups: every training group no learner step has consumed, and why it was not.
-- (Training groups: not eval, imported or retry groups; a retry group holds a method's auxiliary
-- rows, which its own views hand to the learner.)
--
-- The promise (docs/reliability.md): a committed group is trained on, or it went stale for a
-- reason this view names. Each learner step records the snapshot of the query that chose its
-- groups (learner_steps.batch_snapshot) and each group the id of the transaction that wrote it
-- (groups.xact_id), so whether a step could see a group is known exactly, however the writers'
-- commits interleaved (ids are handed out at INSERT, not at COMMIT: group 7 may commit after 8).
--
-- A step S could take group G when G was committed in S's snapshot and S's policy version was
-- within G's staleness bound (S.policy_version - G.policy_version <= max_staleness). The learner
-- takes eligible groups oldest first (by id), replay groups and the others as two queues
-- (NexGRPO caps replay groups per batch).
-- reason:
--   passed_over  a step that could take G took a newer group of G's queue instead: the learner
--                skipped it. A defect; the failure drill (benchmarks/chaos.py) counts these.
--   waiting      eligible now: the learner takes it at a coming step;
--   late         stale, and no step could take it: it was committed after the last step of its
--                staleness window (a slow or stalled writer, a collector that resumed late);
--   backlog      stale; steps could take it, but each took only older groups of its queue
--                (collectors wrote faster than the learner trained);
--   unknown      written, or its window's steps chosen, before migration 0005 (nothing recorded);
--   replaced     LTE: its hint stage wrote an LTE group, which trains in its place (lte_stages);
--   unsolved     LTE: its hint stage found no correct extra rollout and lte.unsolved is 'skip';
--   hint_stage   LTE: a none-pass group held for its hint stage (not ended yet): the learner
--                takes newer groups meanwhile by design, so this is not 'passed_over'.
-- Columns: run_id, group_id, task_id, kind, policy_version, learner_version, staleness, reason,
-- steps_that_could_take, created_at.
-- Settings read: learner.max_staleness (default 1), from run_settings (through the function
-- run_setting; and via learner_eligible); lte.mode and lte.unsolved (LTE runs).
-- Example: SELECT reason, count(*) FROM untrained_groups WHERE run_id = 1 GROUP BY reason;
CREATE OR REPLACE VIEW untrained_groups AS
WITH u AS (
    SELECT e.run_id, e.group_id, e.task_id, e.kind, e.policy_version, e.learner_version, e.staleness,
           e.eligible, e.created_at, g.xact_id,
           run_setting(e.run_id, 'learner.max_staleness', '1')::int AS max_staleness,
           s.status AS lte_status, s.lte_group_id, run_setting(e.run_id, 'lte.unsolved', 'train') AS lte_unsolved,
           (run_setting(e.run_id, 'lte.mode', '') <> '' AND e.kind = 'fresh'
            AND NOT EXISTS (SELECT 1 FROM trajectories t WHERE t.group_id = e.group_id
                            AND (t.correct OR t.reward IS NULL))) AS lte_none_pass
    FROM learner_eligible e
    JOIN groups g ON g.id = e.group_id
    LEFT JOIN lte_stages s ON s.group_id = e.group_id
    WHERE e.kind NOT IN ('eval', 'imported', 'retry') AND e.times_consumed = 0
)
SELECT
    u.run_id,
    u.group_id,
    u.task_id,
    u.kind,
    u.policy_version,
    u.learner_version,
    u.staleness,
    CASE
        WHEN u.xact_id IS NULL OR w.unrecorded > 0 THEN 'unknown'
        WHEN u.lte_status = 'done' AND u.lte_group_id IS NOT NULL THEN 'replaced'
        WHEN u.lte_status = 'done' AND u.lte_unsolved = 'skip' THEN 'unsolved'
        WHEN u.lte_none_pass AND u.lte_status IS DISTINCT FROM 'done' AND u.lte_status IS DISTINCT FROM 'released'
            THEN 'hint_stage'
        WHEN w.took_newer > 0 THEN 'passed_over'
        WHEN u.eligible THEN 'waiting'
        WHEN w.could_take = 0 THEN 'late'
        ELSE 'backlog'
    END AS reason,
    w.could_take AS steps_that_could_take,
    u.created_at
FROM u
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE st.batch_snapshot IS NULL) AS unrecorded,
           count(*) FILTER (WHERE v.visible) AS could_take,
           count(*) FILTER (WHERE v.visible AND EXISTS (
               SELECT 1 FROM consumption c JOIN groups h ON h.id = c.group_id
               WHERE c.step_id = st.id AND c.group_id > u.group_id
                 AND (h.kind = 'replay') = (u.kind = 'replay'))) AS took_newer
    FROM learner_steps st
    CROSS JOIN LATERAL (
        SELECT coalesce(pg_visible_in_snapshot(u.xact_id::text::xid8, st.batch_snapshot::pg_snapshot), false)
               AS visible
    ) v
    WHERE st.run_id = u.run_id
      AND st.policy_version >= u.policy_version
      AND st.policy_version - u.policy_version <= u.max_staleness
) w;
