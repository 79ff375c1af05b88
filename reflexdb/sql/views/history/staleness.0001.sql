-- staleness: how many policy versions old each group was when a learner step consumed it.
--
-- Question it answers: "how off-policy is training?" (ARCHITECTURE.md, async and staleness:
-- the bound eta of AReaL's max_head_offpolicyness). One row per (group, learner step) in which
-- the step consumed at least one of the group's trajectories.
-- staleness = the learner's policy version at that step minus the version that produced the
-- group (groups.policy_version); oldest_token_version is the oldest version among the consumed
-- trajectories' tokens (partial rollouts can span versions), token_staleness its distance.
-- Columns: run_id, group_id, step_id, step, learner_version, producing_version, staleness,
-- oldest_token_version, token_staleness, n_consumed (trajectories of the group in that step),
-- kind, consumed_at.
-- Settings read: none.
-- Example: SELECT staleness, count(*) FROM staleness WHERE run_id = 1 GROUP BY 1 ORDER BY 1;
CREATE OR REPLACE VIEW staleness AS
SELECT
    g.run_id,
    g.id AS group_id,
    s.id AS step_id,
    s.step,
    s.policy_version AS learner_version,
    g.policy_version AS producing_version,
    s.policy_version - g.policy_version AS staleness,
    min(t.policy_version) AS oldest_token_version,
    s.policy_version - min(t.policy_version) AS token_staleness,
    count(*)::int AS n_consumed,
    g.kind,
    s.created_at AS consumed_at
FROM consumption c
JOIN learner_steps s ON s.id = c.step_id
JOIN groups g ON g.id = c.group_id
JOIN trajectories t ON t.id = c.trajectory_id
GROUP BY g.run_id, g.id, s.id, s.step, s.policy_version, g.policy_version, g.kind, s.created_at;
