-- drop_run_partitions: delete a run by dropping its partitions, then its remaining rows.
--
-- Dropping a partition frees its disk at once and leaves nothing to vacuum, where a DELETE of
-- millions of rows would scan, mark and later vacuum every one. The per-trajectory partitions go
-- first (nothing refers to them), then the rows of the shared tables that refer to the run's
-- trajectories (reflections, purifications, replay requests), then the trajectories partition
-- (detached first: PostgreSQL checks that nothing refers to it any more), and last the runs row,
-- whose foreign keys delete the run's tasks, groups, steps, versions and the rest.
-- Arguments: run_id bigint. Returns void. VOLATILE.
-- Example: SELECT drop_run_partitions(7);
CREATE OR REPLACE FUNCTION drop_run_partitions(run_id bigint) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['consumption', 'turns', 'token_bytes', 'embeddings'] LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I', t || '_r' || run_id);
    END LOOP;
    DELETE FROM reflections r WHERE r.run_id = drop_run_partitions.run_id;
    DELETE FROM purifications p WHERE p.run_id = drop_run_partitions.run_id;
    DELETE FROM replay_requests q WHERE q.run_id = drop_run_partitions.run_id;
    IF to_regclass('trajectories_r' || run_id) IS NOT NULL THEN
        EXECUTE format('ALTER TABLE trajectories DETACH PARTITION %I', 'trajectories_r' || run_id);
        EXECUTE format('DROP TABLE %I', 'trajectories_r' || run_id);
    END IF;
    DELETE FROM runs r WHERE r.id = drop_run_partitions.run_id;
END
$$;
