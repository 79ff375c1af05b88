-- run_setting: one run setting as text, or the caller's default when the run has none.
--
-- Views read their settings (NexGRPO's confidence gate, the learner's staleness and reuse
-- limits) from run_settings, where the learner writes them at start; a key not written yet, or
-- written as JSON null, reads as default_value. The value is the JSON scalar as text
-- (value #>> '{}'): the caller casts it, e.g. run_setting(r.id, 'nexgrpo.conf_low', '0.2')::float8,
-- so a value that is not of the expected type fails loudly instead of reading as the default.
-- Runs with the caller's rights: whoever selects from a view that calls it needs SELECT on
-- run_settings (every reflexdb role has it; sql/roles.sql).
-- Arguments: run_id bigint, key text, default_value text. Returns text. STABLE (reads a table).
-- Example: SELECT name, run_setting(id, 'learner.max_staleness', '1')::int FROM runs;
CREATE OR REPLACE FUNCTION run_setting(run_id bigint, key text, default_value text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce((SELECT s.value #>> '{}' FROM run_settings s
                      WHERE s.run_id = run_setting.run_id AND s.key = run_setting.key),
                    run_setting.default_value)
$$;
