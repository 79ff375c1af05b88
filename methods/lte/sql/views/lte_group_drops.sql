-- lte_group_drops: the groups LTE never trains, for good: the view its Method.drops names, so that
-- collectors' admission control leaves them out of the groups coming steps take.
--
-- Question it answers: "which of this run's groups will no step ever take, by LTE's rule?"
-- Rule (METHODS.md §2, LTE.md Sec. 3: the G' correct extra rollouts replace failed originals; with
-- G' = 0 there is nothing to replace): a group whose hint stage is done without an LTE group (no
-- extra rollout was correct) in a run whose lte.unsolved is 'skip'. LTE's batch rule then never
-- takes it (methods/lte/sql/lte.sql, eligible_groups: stage 'unsolved'); 'done' is a stage's last
-- status, so the group stays out. Not listed, although LTE's part of group_holds names them too:
--   replaced     its LTE group (kind 'hinted', with the original's policy version) trains in its
--                place; admission counts only fresh and replay groups, so the original is the
--                place the LTE group takes and must stay counted;
--   hint_stage   held only until its stage ends: then it trains (done with nothing found under
--                lte.unsolved: train, or released after lte.hint_timeout_s), is replaced, or is
--                listed here.
-- Until its stage ends a group is counted: a collector may wait a little longer than it must,
-- never start a group that would be too stale.
-- Columns: group_id, run_id.
-- Settings read: lte.unsolved (default 'train': nothing listed), through run_setting.
-- Example: SELECT run_id, count(*) FROM lte_group_drops GROUP BY run_id;
CREATE OR REPLACE VIEW lte_group_drops AS
SELECT s.group_id, s.run_id
FROM lte_stages s
WHERE s.status = 'done' AND s.lte_group_id IS NULL
  AND run_setting(s.run_id, 'lte.unsolved', 'train') = 'skip';
