-- bool_array: a token_bytes column of flags (the loss mask) as boolean[].
--
-- One byte per element, 0 or 1 (docs/store.md, "Payload format"). An empty bytea gives '{}'.
-- Arguments: b bytea. Returns boolean[]. IMMUTABLE.
-- Example: SELECT bool_array(loss_mask)[1:5] FROM token_bytes LIMIT 3;
CREATE OR REPLACE FUNCTION bool_array(b bytea) RETURNS boolean[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT ARRAY(
        SELECT get_byte(d.v, i) <> 0
        FROM (SELECT b AS v OFFSET 0) AS d, generate_series(0, length(b) - 1) AS i
        ORDER BY i)
$$;
