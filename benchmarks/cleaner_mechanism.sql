-- CLEANER's mechanism per run, over the rows each learner consumed (docs/experiments.md, "CLEANER against DAPO
-- at 20 learner steps"): trained rows, failed calls per row raw and as trained, rollbacks, solved rows, groups.
-- reflexdb sql "$(grep -v '^--' benchmarks/cleaner_mechanism.sql)" -v names=dapo-s1,cleaner-s1
WITH c AS (
  SELECT r.name, e.*
  FROM consumption k JOIN runs r ON r.id = k.run_id
  JOIN cleaner_tool_errors e ON e.trajectory_id = k.trajectory_id
  WHERE r.name = ANY(string_to_array(:'names', ','))
), g AS (
  SELECT name, group_id, bool_or(coalesce(correct, false)) AS anyc, bool_and(coalesce(correct, false)) AS allc
  FROM c GROUP BY 1, 2
)
SELECT c.name, count(*) AS trained_rows,
       round(avg(raw_tool_errors), 2) AS raw_err_per_row, round(avg(tool_errors), 2) AS trained_err_per_row,
       sum(rollbacks) AS rollbacks, sum(recovered) AS recovered, sum(shallow) AS shallow, sum(deep) AS deep,
       count(*) FILTER (WHERE correct) AS solved,
       count(*) FILTER (WHERE correct AND recovered > 0) AS solved_via_recovery,
       (SELECT count(*) FILTER (WHERE NOT anyc) || ' / ' || count(*) FILTER (WHERE anyc AND NOT allc) || ' / '
               || count(*) FILTER (WHERE allc) FROM g WHERE g.name = c.name) AS groups_none_mixed_all
FROM c GROUP BY c.name ORDER BY 1;
