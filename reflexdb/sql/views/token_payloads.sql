-- token_payloads: each trajectory's token arrays as PostgreSQL arrays, one row per trajectory.
--
-- Question it answers: "which tokens did the model see and write, with what log-probs, under
-- which policy version, and which of them carry loss?" The store keeps these arrays in the table
-- token_bytes as little-endian bytea (fast to write and to read into numpy; docs/store.md,
-- "Payload format"); this view gives them back with the columns and types the table
-- token_payloads had before revision 0014, so queries written against it keep working.
-- Decoding happens per row selected: filter by trajectory_id (or join from trajectories) rather
-- than decoding a whole run.
-- Columns: trajectory_id, prompt_ids int4[], response_ids int4[], logprobs real[] (NULL for
-- imported trajectories), token_policy_versions int4[], loss_mask boolean[].
-- Settings read: none.
-- Example: SELECT trajectory_id, array_length(response_ids, 1), logprobs[1:5]
--          FROM token_payloads WHERE trajectory_id = 42;
CREATE OR REPLACE VIEW token_payloads AS
SELECT
    b.trajectory_id,
    int4_array(b.prompt_ids) AS prompt_ids,
    int4_array(b.response_ids) AS response_ids,
    float4_array(b.logprobs) AS logprobs,
    int4_array(b.token_policy_versions) AS token_policy_versions,
    bool_array(b.loss_mask) AS loss_mask
FROM token_bytes b;
