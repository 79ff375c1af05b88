-- trajectory_tokens: a trajectory's outcome beside its token arrays, one row per trajectory.
--
-- Question it answers: "show me the tokens of these trajectories with what became of them"
-- (reward, correctness, origin, lineage) without joining three tables. The arrays are decoded
-- from token_bytes (little-endian bytea; docs/store.md, "Payload format") only for the rows and
-- columns a query asks for; n_prompt_tokens and n_response_tokens come from the byte lengths and
-- decode nothing.
-- Columns: run_id, task_id, group_id, trajectory_id, index_in_group, origin,
-- parent_trajectory_id, policy_version, reward, correct, n_prompt_tokens, n_response_tokens,
-- prompt_ids int4[], response_ids int4[], logprobs real[] (NULL for imported trajectories),
-- token_policy_versions int4[], loss_mask boolean[].
-- Settings read: none.
-- Example: SELECT trajectory_id, reward, response_ids[1:8], logprobs[1:8]
--          FROM trajectory_tokens WHERE group_id = 7 ORDER BY index_in_group;
CREATE OR REPLACE VIEW trajectory_tokens AS
SELECT
    t.run_id,
    t.task_id,
    t.group_id,
    t.id AS trajectory_id,
    t.index_in_group,
    t.origin,
    t.parent_trajectory_id,
    t.policy_version,
    t.reward,
    t.correct,
    length(b.prompt_ids) / 4 AS n_prompt_tokens,
    length(b.response_ids) / 4 AS n_response_tokens,
    int4_array(b.prompt_ids) AS prompt_ids,
    int4_array(b.response_ids) AS response_ids,
    float4_array(b.logprobs) AS logprobs,
    int4_array(b.token_policy_versions) AS token_policy_versions,
    bool_array(b.loss_mask) AS loss_mask
FROM trajectories t
JOIN token_bytes b ON b.trajectory_id = t.id;
