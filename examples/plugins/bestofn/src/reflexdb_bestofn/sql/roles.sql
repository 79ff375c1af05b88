-- bestofn's grants, run by `reflexdb db roles` and `reflexdb db upgrade` after reflexdb's own
-- (which revoke and re-grant everything; the learner and the reader read every table already).

-- name: grants
GRANT INSERT, DELETE ON bestofn_picks TO reflexdb_learner;
