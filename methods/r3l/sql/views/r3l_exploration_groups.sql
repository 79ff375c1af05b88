-- r3l_exploration_groups: each R3L exploration group with its base and distilled members.
--
-- Rule (R3L.md Sec. 4.1 "Training Groups", App. D.2; METHODS.md §1): the exploration group
-- G_explore = D_base ∪ D_distill (Eq. 7-8) of one task, size N: N/2 base episodes of the policy,
-- a distilled twin for each base episode whose reflection led to a retry, and further base
-- episodes (not reflected on) filling the group to N where a reflection was 'success' or invalid.
-- Advantages are normalised over the whole group (Eq. 4), then amplified (Eq. 11). The group's
-- reflections and retries were written in the same transaction (a group of kind 'retry').
-- Columns: group_id, run_id, task_id, policy_version, size, n_base, n_distilled, base_ids,
-- distilled_ids (trajectory ids, in group order), base_reward_mean, distilled_reward_mean,
-- reward_mean, n_correct, created_at.
-- Settings read: none.
-- Example: SELECT policy_version, avg(n_distilled), avg(distilled_reward_mean - base_reward_mean)
--          FROM r3l_exploration_groups WHERE run_id = 1 GROUP BY 1 ORDER BY 1;
CREATE OR REPLACE VIEW r3l_exploration_groups AS
SELECT
    g.id AS group_id,
    g.run_id,
    g.task_id,
    g.policy_version,
    g.size,
    (count(*) FILTER (WHERE t.origin = 'base'))::int AS n_base,
    (count(*) FILTER (WHERE t.origin = 'distilled'))::int AS n_distilled,
    coalesce(array_agg(t.id ORDER BY t.index_in_group) FILTER (WHERE t.origin = 'base'), '{}') AS base_ids,
    coalesce(array_agg(t.id ORDER BY t.index_in_group) FILTER (WHERE t.origin = 'distilled'), '{}') AS distilled_ids,
    avg(t.reward) FILTER (WHERE t.origin = 'base') AS base_reward_mean,
    avg(t.reward) FILTER (WHERE t.origin = 'distilled') AS distilled_reward_mean,
    avg(t.reward) AS reward_mean,
    (count(*) FILTER (WHERE t.correct))::int AS n_correct,
    g.created_at
FROM groups g
JOIN trajectories t ON t.group_id = g.id
WHERE g.workflow = 'r3l' AND g.kind = 'fresh'
GROUP BY g.id;
