-- float4_array: a token_bytes column of 32-bit floats (behaviour log-probs) as real[].
--
-- Each element is 4 bytes of an IEEE 754 float32, little-endian (docs/store.md, "Payload
-- format"). The bits are rebuilt into the value in float8, where every float32 is exact, then
-- cast to real: the result equals what the collector stored, bit for bit (signed zeros,
-- subnormals and infinities included). An empty bytea gives '{}'.
-- Arguments: b bytea (length a multiple of 4). Returns real[]. IMMUTABLE.
-- Example: SELECT float4_array(logprobs)[1:5] FROM token_bytes LIMIT 3;
CREATE OR REPLACE FUNCTION float4_array(b bytea) RETURNS real[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT ARRAY(
        SELECT (CASE WHEN y.e = 255 THEN CASE WHEN y.m = 0 THEN y.s * 'Infinity'::float8 ELSE 'NaN'::float8 END
                     WHEN y.e = 0 THEN y.s * y.m * 2::float8 ^ -149                    -- subnormal
                     ELSE y.s * (8388608 + y.m) * 2::float8 ^ (y.e - 150) END)::real   -- 1.m x 2^(e-127)
        FROM (SELECT b AS v OFFSET 0) AS d,
             generate_series(0, length(b) - 4, 4) AS i,
             LATERAL (SELECT get_byte(d.v, i) | (get_byte(d.v, i + 1) << 8) | (get_byte(d.v, i + 2) << 16)
                             | (get_byte(d.v, i + 3) << 24) AS bits) AS x,
             LATERAL (SELECT CASE WHEN x.bits < 0 THEN -1::float8 ELSE 1::float8 END AS s,
                             (x.bits >> 23) & 255 AS e, x.bits & 8388607 AS m) AS y
        ORDER BY i)
$$;
