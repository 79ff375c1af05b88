-- Each run's first code call per episode, by bucket of 5 policy versions (docs/experiments.md, "CLEANER against
-- DAPO at 20 learner steps"): the one call both arms sample the same way, before any rollback, so its failure rate
-- compares across arms (later calls of a CLEANER raw twin include the lookahead's corrections). Episodes as
-- benchmarks/experiments/tool_use_by_version.py reads them: a CLEANER run's raw twins, another run's base trajectories.
-- reflexdb sql "$(grep -v '^--' benchmarks/first_call_failures.sql)" -v names=dapo-s2,cleaner-s2
WITH e AS (
  SELECT r.name, g.policy_version / 5 * 5 AS from_version, t.id, t.reward, t.origin,
         bool_or(t.origin = 'raw') OVER (PARTITION BY r.id) AS has_raw
  FROM trajectories t JOIN groups g ON g.id = t.group_id JOIN runs r ON r.id = g.run_id
  WHERE r.name = ANY(string_to_array(:'names', ',')) AND g.kind <> 'eval' AND t.origin IN ('base', 'raw')
), own AS (
  SELECT * FROM e WHERE origin = CASE WHEN has_raw THEN 'raw' ELSE 'base' END
), first_call AS (
  SELECT DISTINCT ON (own.id) own.id, u.tool_error, u.text
  FROM own JOIN turns u ON u.trajectory_id = own.id AND u.role = 'tool'
  ORDER BY own.id, u.turn_index
)
SELECT own.name, own.from_version, count(*) AS episodes, round(avg(own.reward)::numeric, 3) AS reward,
       count(f.id) AS with_a_call, count(*) FILTER (WHERE f.tool_error) AS first_call_failed,
       count(*) FILTER (WHERE f.text LIKE '%''math'' is not defined%') AS first_call_no_import
FROM own LEFT JOIN first_call f ON f.id = own.id
GROUP BY 1, 2 ORDER BY 1, 2;
