-- Rows that create_tasks writes are validated and complete before they are written (sql/100_definitions.sql:
-- set-based validation of every definition of the call, policy and flow columns materialized, pending parents and
-- task counters computed), so the triggers that the plain-SQL path needs (SPEC §2) have nothing to do for them.
-- Each of those triggers carries `WHEN (NOT stepready._validated_write())` and is not even called for such a
-- row or statement: no trigger function runs per row created by create_tasks.
--
-- _validated_write() is true only inside stepready._create_tasks: that function runs as its owner
-- (SECURITY DEFINER) with `SET stepready.validated_write = 'on'`, and the test requires both the setting and the
-- owner as current user. A client may set the setting itself (any user may set a custom setting), but its
-- plain INSERTs run as the client, so the triggers still validate them: the setting alone buys nothing. The
-- owner could skip the triggers this way, as it could disable them outright.
--
-- The owner's name is written into the test when it is (re)created, as a literal: a trigger's WHEN clause may
-- not hold a subquery. And the test is written into each WHEN clause itself, not called as a function: a
-- LANGUAGE sql function would be inlined, which means parsing its body again for every statement that fires the
-- trigger. _validated_write_sql() returns the test's text, which the files that define those triggers put in
-- place of `stepready._validated_write()` (a DO block each); _validated_write() is the same test as a function,
-- for _create_tasks to check itself. `scheduler migrate up` re-creates all of them on every run. _create_tasks
-- refuses to write if its owner no longer matches (ALTER FUNCTION … OWNER TO without a migration), rather than
-- write rows the triggers would count a second time.
DO $validated$
DECLARE
    v_owner name;
    v_test  text;
BEGIN
    SELECT r.rolname INTO v_owner
      FROM pg_catalog.pg_proc p
      JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
     WHERE p.oid = pg_catalog.to_regprocedure('stepready._create_tasks(jsonb, boolean)');
    v_test := format('(pg_catalog.current_setting(''stepready.validated_write'', true) IS NOT DISTINCT FROM ''on'''
                     ' AND CURRENT_USER = %L::name)', COALESCE(v_owner, CURRENT_USER));
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION stepready._validated_write_sql()
        RETURNS text
        LANGUAGE sql IMMUTABLE
        AS $body$
            SELECT %L::text;
        $body$
    $fn$, v_test);
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION stepready._validated_write()
        RETURNS bool
        LANGUAGE sql STABLE
        AS $body$
            SELECT %s;
        $body$
    $fn$, v_test);
END;
$validated$;
