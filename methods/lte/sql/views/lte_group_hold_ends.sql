-- lte_group_hold_ends: LTE's part of the composed view group_hold_ends: when LTE let go a group it
-- held for its hint stage.
--
-- Question it answers: "since when has this group been free for the learner (or replaced)?" One
-- row per hint stage that ended: 'done' (its LTE group trains in its place, or it found nothing
-- correct) or 'released' (the learner took the group as it is after the timeout); held_until is
-- the stage's completed_at. untrained_groups judges the group by the steps after it (revision
-- 0024): a stage that ended after the group's staleness window gives 'held_past_staleness', not
-- 'passed_over'.
-- Columns: group_id, held_until.
-- Settings read: none.
-- Example: SELECT s.group_id, s.status, h.held_until FROM lte_group_hold_ends h JOIN lte_stages s USING (group_id);
CREATE OR REPLACE VIEW lte_group_hold_ends AS
SELECT s.group_id, s.completed_at AS held_until
FROM lte_stages s
WHERE s.status IN ('done', 'released') AND s.completed_at IS NOT NULL;
