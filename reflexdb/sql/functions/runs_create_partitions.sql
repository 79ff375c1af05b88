-- runs_create_partitions: the trigger function of runs_partitions (AFTER INSERT ON runs): the new
-- run's partitions (create_run_partitions), in the transaction that inserts the run.
--
-- Arguments: none (a trigger). Returns trigger. VOLATILE.
-- Example: INSERT INTO runs (name) VALUES ('demo');  -- creates trajectories_r<id>, turns_r<id>, ...
CREATE OR REPLACE FUNCTION runs_create_partitions() RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM create_run_partitions(NEW.id);
    RETURN NULL;
END
$$;
