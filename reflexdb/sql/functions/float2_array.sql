-- float2_array: a token_signals column of 16-bit floats (advantages, log-ratios, entropies) as real[].
--
-- Each element is 2 bytes of an IEEE 754 binary16, little-endian (docs/store.md, "Payload
-- format"): a sign bit, 5 exponent bits (bias 15), 10 mantissa bits. Every float16 is exact in
-- real, so the result equals what the learner stored, bit for bit (NaN where the loss gave a token
-- no value, signed zeros, subnormals and infinities included). An empty bytea gives '{}'.
-- Arguments: b bytea (length a multiple of 2). Returns real[]. IMMUTABLE.
-- Example: SELECT float2_array(advantage)[1:5], float2_array(entropy)[1:5] FROM token_signals LIMIT 3;
CREATE OR REPLACE FUNCTION float2_array(b bytea) RETURNS real[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT ARRAY(
        SELECT (CASE WHEN y.e = 31 THEN CASE WHEN y.m = 0 THEN y.s * 'Infinity'::float8 ELSE 'NaN'::float8 END
                     WHEN y.e = 0 THEN y.s * y.m * 2::float8 ^ -24                    -- subnormal
                     ELSE y.s * (1024 + y.m) * 2::float8 ^ (y.e - 25) END)::real      -- 1.m x 2^(e-15)
        FROM (SELECT b AS v OFFSET 0) AS d,
             generate_series(0, length(b) - 2, 2) AS i,
             LATERAL (SELECT get_byte(d.v, i) | (get_byte(d.v, i + 1) << 8) AS bits) AS x,
             LATERAL (SELECT CASE WHEN x.bits >= 32768 THEN -1::float8 ELSE 1::float8 END AS s,
                             (x.bits >> 10) & 31 AS e, x.bits & 1023 AS m) AS y
        ORDER BY i)
$$;
