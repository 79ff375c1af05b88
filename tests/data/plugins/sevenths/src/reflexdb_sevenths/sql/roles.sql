-- sevenths' grants, run by `reflexdb db roles` and `reflexdb db upgrade` after reflexdb's own (which
-- revoke and re-grant everything): collectors read the groups it never trains (admission control).

-- name: grants
GRANT SELECT ON sevenths_group_holds TO reflexdb_collector;
