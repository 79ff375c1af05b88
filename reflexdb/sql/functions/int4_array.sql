-- int4_array: a token_bytes column of 32-bit integers (token ids, per-token policy versions) as int4[].
--
-- token_bytes stores each per-token array as one bytea of little-endian values (4 bytes per
-- element), which the server sends as one block and the client reads with numpy.frombuffer
-- (docs/store.md, "Payload format"). This gives the array back to people in SQL. Exact; an
-- empty bytea gives '{}'. Pure SQL, so it needs no extension and runs on any PostgreSQL >= 13.
-- (The OFFSET 0 subquery reads the argument once: without it every get_byte re-reads the value.)
-- Arguments: b bytea (length a multiple of 4). Returns int4[]. IMMUTABLE.
-- Example: SELECT int4_array(response_ids)[1:5] FROM token_bytes LIMIT 3;
CREATE OR REPLACE FUNCTION int4_array(b bytea) RETURNS int4[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT ARRAY(
        SELECT get_byte(d.v, i) | (get_byte(d.v, i + 1) << 8) | (get_byte(d.v, i + 2) << 16)
               | (get_byte(d.v, i + 3) << 24)
        FROM (SELECT b AS v OFFSET 0) AS d, generate_series(0, length(b) - 4, 4) AS i
        ORDER BY i)
$$;
