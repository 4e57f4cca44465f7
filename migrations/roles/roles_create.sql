-- The four roles of SPEC §17, created NOLOGIN unless they exist. Roles are cluster-wide: two databases of one
-- cluster migrated at once may both try to create a role, so a role created meanwhile by another migrator is
-- not an error. Left out by `migrate up --skip-roles`.
DO $create$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['stepready_client', 'stepready_worker', 'stepready_operator', 'stepready_reader'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created by a concurrent migrator
            END;
        END IF;
    END LOOP;
END;
$create$;
