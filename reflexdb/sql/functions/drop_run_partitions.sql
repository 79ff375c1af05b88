-- drop_run_partitions: delete a run by dropping its partitions, then its remaining rows.
--
-- Dropping a partition frees its disk at once and leaves nothing to vacuum, where a DELETE of
-- millions of rows would scan, mark and later vacuum every one. The per-trajectory partitions go
-- first (token_signals before the consumption it refers to, 0028; nothing else refers to them), then the rows of every other table that refers to the run's
-- trajectories by a foreign key (a method's: R3L's reflections, CLEANER's rollbacks, NexGRPO's
-- replay requests, a plug-in's), found in the catalogue by the column that refers to
-- trajectories.run_id, so a method's table needs nothing here (revision 0019); then the
-- trajectories partition (detached first: PostgreSQL checks that nothing refers to it any more),
-- and last the runs row, whose foreign keys delete the run's tasks, groups, steps, versions and
-- the rest.
-- Arguments: run_id bigint. Returns void. VOLATILE.
-- Example: SELECT drop_run_partitions(7);
CREATE OR REPLACE FUNCTION drop_run_partitions(run_id bigint) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    t text;
    ref record;
BEGIN
    EXECUTE format('DROP TABLE IF EXISTS %I', 'token_signals_r' || run_id);
    -- token_signals refers to consumption (0028): its partition is detached before it is dropped,
    -- as the trajectories partition is below
    IF to_regclass('consumption_r' || run_id) IS NOT NULL THEN
        EXECUTE format('ALTER TABLE consumption DETACH PARTITION %I', 'consumption_r' || run_id);
        EXECUTE format('DROP TABLE %I', 'consumption_r' || run_id);
    END IF;
    FOREACH t IN ARRAY ARRAY['turns', 'token_bytes', 'embeddings'] LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I', t || '_r' || run_id);
    END LOOP;
    FOR ref IN
        SELECT DISTINCT c.conrelid::regclass::text AS tab, a.attname AS col
        FROM pg_constraint c
        CROSS JOIN LATERAL unnest(c.conkey, c.confkey) AS k(own, referred)
        JOIN pg_attribute r ON r.attrelid = c.confrelid AND r.attnum = k.referred AND r.attname = 'run_id'
        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.own
        JOIN pg_class o ON o.oid = c.conrelid
        WHERE c.contype = 'f' AND c.confrelid = 'trajectories'::regclass AND c.conparentid = 0
          AND o.relkind = 'r'  -- plain tables: the partitioned ones lost this run's partition above
        ORDER BY 1, 2
    LOOP
        EXECUTE format('DELETE FROM %s WHERE %I = $1', ref.tab, ref.col) USING run_id;
    END LOOP;
    IF to_regclass('trajectories_r' || run_id) IS NOT NULL THEN
        EXECUTE format('ALTER TABLE trajectories DETACH PARTITION %I', 'trajectories_r' || run_id);
        EXECUTE format('DROP TABLE %I', 'trajectories_r' || run_id);
    END IF;
    DELETE FROM runs r WHERE r.id = drop_run_partitions.run_id;
END
$$;
