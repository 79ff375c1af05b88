-- lte_group_holds: LTE's part of the composed view group_holds: the groups LTE holds back from the
-- learner, or trained another group in place of, and why (view untrained_groups shows the reason).
--
-- Question it answers: "which of this run's groups is LTE keeping from the learner?" reason:
--   replaced     its hint stage wrote an LTE group, which trains in its place (lte_stages);
--   unsolved     its hint stage found no correct extra rollout and lte.unsolved is 'skip';
--   hint_stage   a none-pass fresh group of an LTE run held for its hint stage (not ended yet, not
--                released to the learner after its timeout).
-- Groups of other runs, and groups LTE does not hold, have no row (LTE's branch, lte_0002; the rule
-- was in untrained_groups before revision 0021).
-- Columns: group_id, reason.
-- Settings read: lte.mode (set: an LTE run) and lte.unsolved (default 'train'), through run_setting.
-- Example: SELECT reason, count(*) FROM lte_group_holds GROUP BY reason;
CREATE OR REPLACE VIEW lte_group_holds AS
SELECT x.group_id, x.reason
FROM (
    SELECT g.id AS group_id,
           CASE
               WHEN s.status = 'done' AND s.lte_group_id IS NOT NULL THEN 'replaced'
               WHEN s.status = 'done' AND run_setting(g.run_id, 'lte.unsolved', 'train') = 'skip' THEN 'unsolved'
               WHEN g.kind = 'fresh' AND s.status IS DISTINCT FROM 'done' AND s.status IS DISTINCT FROM 'released'
                    AND run_setting(g.run_id, 'lte.mode', '') <> ''
                    AND NOT EXISTS (SELECT 1 FROM trajectories t
                                     WHERE t.group_id = g.id AND t.run_id = g.run_id
                                       AND (t.correct OR t.reward IS NULL))
                   THEN 'hint_stage'
           END AS reason
    FROM groups g
    LEFT JOIN lte_stages s ON s.group_id = g.id
) x
WHERE x.reason IS NOT NULL;
