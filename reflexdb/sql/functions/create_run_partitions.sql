-- create_run_partitions: one partition per partitioned table for a run (trajectories, turns,
-- token_bytes, embeddings, consumption, token_signals), named <table>_r<run_id>; a partition that
-- exists is kept.
--
-- Called by the trigger on runs (runs_create_partitions) when a run is inserted, so every run has
-- its partitions before its first row, and by migrations 0015 and 0028 for the runs that existed.
-- token_bytes and token_signals (0028) partitions keep rows up to 4080 bytes inline and uncompressed, two to a page (toast_tuple_target;
-- a partitioned table takes no storage parameters of its own); longer rows are compressed first
-- (per-token versions and the mask shrink to almost nothing), then moved out of line. SECURITY DEFINER: a collector's role may create a
-- run but owns no table, and only a table's owner may add partitions to it. search_path is fixed to
-- the schema the migration ran in. Where `reflexdb db roles` made the reader and learner roles,
-- they may read the new partitions directly too, as they may every table (sql/roles.sql).
-- Arguments: run_id bigint. Returns void. VOLATILE.
-- Example: SELECT create_run_partitions(7);
CREATE OR REPLACE FUNCTION create_run_partitions(run_id bigint) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    t text;
BEGIN
    -- trajectories first: the others refer to it (token_signals to consumption)
    FOREACH t IN ARRAY ARRAY['trajectories', 'turns', 'token_bytes', 'embeddings', 'consumption', 'token_signals'] LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I FOR VALUES IN (%s)%s',
                       t || '_r' || run_id, t, run_id,
                       CASE WHEN t IN ('token_bytes', 'token_signals') THEN ' WITH (toast_tuple_target = 4080)'
                            ELSE '' END);
        IF (SELECT count(*) FROM pg_roles WHERE rolname IN ('reflexdb_reader', 'reflexdb_learner')) = 2 THEN
            EXECUTE format('GRANT SELECT ON %I TO reflexdb_reader, reflexdb_learner', t || '_r' || run_id);
        END IF;
    END LOOP;
END
$$;
