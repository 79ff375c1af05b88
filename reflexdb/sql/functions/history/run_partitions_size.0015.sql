-- run_partitions_size: bytes on disk of a run's partitions (trajectories, turns, token_bytes,
-- embeddings, consumption), with their indexes and TOAST; 0 for a run without partitions.
--
-- Read from the catalog (pg_total_relation_size), so it costs nothing however large the run is.
-- The run's rows in the shared tables (groups, tasks, steps, reflections, ...) are small and not
-- counted.
-- Arguments: run_id bigint. Returns bigint. STABLE.
-- Example: SELECT name, pg_size_pretty(run_partitions_size(id)) FROM runs;
CREATE OR REPLACE FUNCTION run_partitions_size(run_id bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(sum(pg_total_relation_size(to_regclass(t || '_r' || run_id))), 0)::bigint
    FROM unnest(ARRAY['trajectories', 'turns', 'token_bytes', 'embeddings', 'consumption']) AS t
$$;
