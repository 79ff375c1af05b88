-- compose_view: (re)create a view that is the UNION ALL of the parts methods contribute to it.
--
-- A core view that must know something only a method knows (which groups LTE holds back from the
-- learner, R3L's root cause of a failure) reads a composed view instead of the method's tables:
-- group_holds, failure_notes (table composed_views lists each with its columns). A method adds a
-- part by creating a view named <method>_<composed view> (lte_group_holds) with exactly those
-- columns, then calling compose_view('<composed view>'); its downgrade calls
-- compose_view('<composed view>', '<its part>') to leave its part out before it drops it. With no
-- part the view is empty, with the right column types. Parts are found by name in the schema of
-- the composed view, in name order (revision 0021; docs/design.md "Adding a method").
-- Arguments: target text, left_out text (a part to leave out; default none). Returns void. VOLATILE.
-- Example: SELECT compose_view('group_holds');
CREATE OR REPLACE FUNCTION compose_view(target text, left_out text DEFAULT NULL::text) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    cols text[];
    types text[];
    names text;
    parts text;
BEGIN
    SELECT c.columns, c.types INTO cols, types FROM composed_views c WHERE c.name = target;
    IF cols IS NULL THEN
        RAISE EXCEPTION 'compose_view: % is not a composed view (table composed_views)', target;
    END IF;
    SELECT string_agg(format('%I', n), ', ' ORDER BY i) INTO names FROM unnest(cols) WITH ORDINALITY AS x(n, i);
    SELECT string_agg(format('SELECT %s FROM %I', names, v.viewname), ' UNION ALL ' ORDER BY v.viewname)
      INTO parts
      FROM pg_views v
     WHERE v.schemaname = current_schema() AND v.viewname LIKE '%\_' || replace(target, '_', '\_')
       AND v.viewname <> target
       AND v.viewname IS DISTINCT FROM left_out;
    IF parts IS NULL THEN  -- no part: no row, the columns typed
        SELECT 'SELECT ' || string_agg(format('NULL::%s AS %I', t, n), ', ' ORDER BY i) || ' WHERE false'
          INTO parts FROM unnest(cols, types) WITH ORDINALITY AS x(n, t, i);
    END IF;
    EXECUTE format('CREATE OR REPLACE VIEW %I AS %s', target, parts);
END
$$;
