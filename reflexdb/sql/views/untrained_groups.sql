-- untrained_groups: every training group no learner step has consumed, and why it was not.
-- (Training groups: of a kind the learner takes as a group, table group_kinds, but not imported
-- ones: eval groups are not, nor a method's auxiliary retry groups, whose rows its own views hand
-- to the learner.)
--
-- The promise (docs/reliability.md): a committed group is trained on, or it went stale for a
-- reason this view names. Each learner step records the snapshot of the query that chose its
-- groups (learner_steps.batch_snapshot) and each group the id of the transaction that wrote it
-- (groups.xact_id), so whether a step could see a group is known exactly, however the writers'
-- commits interleaved (ids are handed out at INSERT, not at COMMIT: group 7 may commit after 8).
--
-- A step S could take group G when G was committed in S's snapshot and S's policy version was
-- within G's staleness bound (S.policy_version - G.policy_version <= max_staleness). The learner
-- takes eligible groups oldest first (by id), in the queue of their kind (group_kinds.queue, 0027:
-- a method may take a kind by a quota of its own, as NexGRPO its replay groups).
-- reason:
--   passed_over  a step that could take G took a newer group of G's queue instead: the learner
--                skipped it. A defect; the failure drill (benchmarks/chaos.py) counts these.
--   waiting      eligible now: the learner takes it at a coming step;
--   late         stale, and no step could take it: it was committed after the last step of its
--                staleness window (a slow or stalled writer, a collector that resumed late);
--   backlog      stale; steps could take it, but each took only older groups of its queue
--                (collectors wrote faster than the learner trained);
--   unknown      written, or its window's steps chosen, before migration 0005 (nothing recorded);
--   a method's   a method holds the group back from the learner, or trained another in its place:
--   reason       the reason its part of the composed view group_holds gives (revision 0021; LTE's
--                lte_group_holds: replaced, unsolved, hint_stage, see docs/lte.md). The learner
--                takes newer groups meanwhile by design, so such a group is not 'passed_over'.
--   held_past_staleness  a method held the group and let it go (the composed view group_hold_ends
--                gives when: LTE's hint stage ended, revision 0024) after the last step of its
--                staleness window had chosen its groups: no step could take it once it was free.
-- A held group that was let go is judged by the steps that chose their groups after it was: a step
-- counts when the step before it was recorded after the hold ended (the learner chooses a step's
-- groups after recording the one before), so the steps that took newer groups while it was held
-- do not make it 'passed_over' (issue 37: a hint stage whose collector was killed ended late).
-- Columns: run_id, group_id, task_id, kind, policy_version, learner_version, staleness, reason,
-- steps_that_could_take (after its hold ended, for a group a method held), created_at.
-- Settings read: learner.max_staleness (default 1), from run_settings (through the function
-- run_setting; and via learner_eligible); whatever a part of group_holds reads (LTE's: lte.mode,
-- lte.unsolved).
-- Example: SELECT reason, count(*) FROM untrained_groups WHERE run_id = 1 GROUP BY reason;
CREATE OR REPLACE VIEW untrained_groups AS
WITH u AS (
    SELECT e.run_id, e.group_id, e.task_id, e.kind, e.policy_version, e.learner_version, e.staleness,
           e.eligible, e.created_at, g.xact_id,
           run_setting(e.run_id, 'learner.max_staleness', '1')::int AS max_staleness,
           (SELECT h.reason FROM group_holds h WHERE h.group_id = e.group_id LIMIT 1) AS held,
           (SELECT max(x.held_until) FROM group_hold_ends x WHERE x.group_id = e.group_id) AS held_until
    FROM learner_eligible e
    JOIN groups g ON g.id = e.group_id
    JOIN group_kinds k ON k.name = e.kind
    WHERE k.trained AND e.kind <> 'imported' AND e.times_consumed = 0
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
        ELSE coalesce(u.held,  -- a method's reason (group_holds), read once per group
                      CASE
                          WHEN w.took_newer > 0 THEN 'passed_over'
                          WHEN u.eligible THEN 'waiting'
                          WHEN w.could_take = 0 AND u.held_until IS NOT NULL THEN 'held_past_staleness'
                          WHEN w.could_take = 0 THEN 'late'
                          ELSE 'backlog'
                      END)
    END AS reason,
    w.could_take AS steps_that_could_take,
    u.created_at
FROM u
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE st.batch_snapshot IS NULL) AS unrecorded,
           count(*) FILTER (WHERE v.visible) AS could_take,
           count(*) FILTER (WHERE v.visible AND EXISTS (
               SELECT 1 FROM consumption c JOIN groups h ON h.id = c.group_id
               JOIN group_kinds hk ON hk.name = h.kind
               WHERE c.step_id = st.id AND c.group_id > u.group_id
                 AND hk.queue = (SELECT queue FROM group_kinds WHERE name = u.kind))) AS took_newer
    FROM learner_steps st
    CROSS JOIN LATERAL (
        SELECT coalesce(pg_visible_in_snapshot(u.xact_id::text::xid8, st.batch_snapshot::pg_snapshot), false)
               AND (u.held_until IS NULL
                    OR (SELECT max(p.created_at) FROM learner_steps p
                        WHERE p.run_id = st.run_id AND p.step < st.step) > u.held_until)
               AS visible
    ) v
    WHERE st.run_id = u.run_id
      AND st.policy_version >= u.policy_version
      AND st.policy_version - u.policy_version <= u.max_staleness
) w;
