-- selfcheck's grants to the reflexdb roles: `reflexdb db roles` and `reflexdb db upgrade` run the
-- block "grants" after reflexdb's own (which revoke and re-grant everything), so the collectors keep
-- writing verdicts. The learner and the reader read every table and view already.

-- name: grants
GRANT SELECT, INSERT ON selfcheck_verifications TO reflexdb_collector;
