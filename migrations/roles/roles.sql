-- Least privilege (SPEC §17): four NOLOGIN roles and exactly what each job needs, applied by migrations.Up after
-- the functions and River's tables, on every run, so a function re-created by CREATE OR REPLACE gets its
-- privileges and its SECURITY DEFINER back. docs/security.md explains every decision; the test
-- migrations/roles_test.go fails when a function of schema stepready has no decision here.
--
-- Roles are cluster-wide, so CREATE ROLE is in roles_create.sql, which `migrate up --skip-roles` leaves out
-- (for a migrating user without CREATEROLE, when a DBA created the roles). What follows grants to each of the
-- four roles that exists.

-- Which public function serves which job. Every function of schema stepready whose name does not start with an
-- underscore must be listed: the test compares this list with pg_proc. Internal functions (a leading
-- underscore) are helpers called by the public ones with the caller's rights; every role may execute them,
-- and they can do no more than the caller's table privileges allow.
CREATE TEMPORARY TABLE stepready_function_roles (name text PRIMARY KEY, roles text[] NOT NULL) ON COMMIT DROP;
INSERT INTO stepready_function_roles (name, roles) VALUES
    -- Pure rules and reads: everyone.
    ('retry_eligible',             '{client,worker,operator,reader}'),
    ('backoff_delay_ms',           '{client,worker,operator,reader}'),
    ('step_readiness',             '{client,worker,operator,reader}'),
    ('task_execution_context',     '{client,worker,operator,reader}'),
    ('explain_step',               '{client,worker,operator,reader}'),
    ('explain_task',               '{client,worker,operator,reader}'),
    ('readiness_reasons',          '{client,worker,operator,reader}'),
    ('execution_statuses',         '{client,worker,operator,reader}'),
    ('validate_task_definition',   '{client,worker,operator,reader}'),
    ('schedule_idempotency_key',   '{client,worker,operator,reader}'),
    ('queue_stats',                '{client,worker,operator,reader}'),
    ('flow_status',                '{client,worker,operator,reader}'),
    ('map_stats',                  '{client,worker,operator,reader}'),
    ('signal_stats',               '{client,worker,operator,reader}'),
    -- Creating tasks: clients, and the daemon (schedules create tasks from templates).
    ('create_task',                '{client,worker}'),
    ('create_tasks',               '{client,worker}'),
    ('create_task_from_template',  '{client,worker}'),
    ('create_tasks_from_template', '{client,worker}'),
    -- The daemon: claims, attempts, outcomes, leases, schedules firing.
    ('claim_ready_steps',          '{worker}'),
    ('claim_and_start_steps',      '{worker}'),
    ('start_step',                 '{worker}'),
    ('start_steps',                '{worker}'),
    ('heartbeat_step',             '{worker}'),
    ('complete_step',              '{worker}'),
    ('complete_steps',             '{worker}'),
    ('fail_step',                  '{worker}'),
    ('fail_steps',                 '{worker}'),
    ('continue_step',              '{worker}'),
    ('release_step',               '{worker}'),
    ('reap_expired_leases',        '{worker}'),
    ('record_policy_evaluation',   '{worker}'),
    ('next_claim_at',              '{worker}'),
    ('next_flow_at',               '{worker}'),
    ('due_schedules',              '{worker}'),
    ('next_schedule_wake',         '{worker}'),
    ('fire_schedule',              '{worker}'),
    ('schedule_failed',            '{worker}'),
    ('set_schedule_next_fire',     '{worker}'),
    ('prune_tasks',                '{worker}'),
    ('prune_flow_state',           '{worker}'),
    -- Operators (SPEC §9), and schedule management.
    ('cancel_task',                '{operator}'),
    ('pause_task',                 '{operator}'),
    ('resume_task',                '{operator}'),
    ('retry_step_now',             '{operator}'),
    ('resolve_step',               '{operator}'),
    ('reset_task',                 '{operator}'),
    ('put_schedule',               '{operator}'),
    ('pause_schedule',             '{operator}'),
    ('resume_schedule',            '{operator}'),
    ('delete_schedule',            '{operator}'),
    -- Signals (SPEC §20): whoever may create a task may signal it, and operators.
    ('send_signal',                '{client,operator}'),
    ('send_signal_to_key',         '{client,operator}'),
    -- Wake-ups (sql/045_notify.sql): whoever writes may wake the daemons after committing; daemons and
    -- workers probe the counter.
    ('wake_daemons',               '{client,worker,operator}'),
    ('wake_count',                 '{worker}'),
    -- Flow control overrides (SPEC §14).
    ('set_flow_limit',             '{operator}'),
    ('clear_flow_limit',           '{operator}');

-- Functions that run with their owner's rights (SECURITY DEFINER, search_path pinned to pg_catalog so that no
-- object of the caller's can stand in for a built-in): the operator functions, so that an operator needs no
-- write privilege on tasks and steps and can change them only through the audited functions of SPEC §9; the
-- trigger functions that keep bookkeeping on rows a client may not change itself (a client inserting steps or
-- edges makes the triggers update task counters and pending parents, and lock the task row); and _create_tasks
-- (behind create_task(s)), whose rows skip those triggers because they are validated and complete, which the
-- triggers recognise by the owner running it (sql/018_validated_write.sql).
CREATE TEMPORARY TABLE stepready_definer (name text PRIMARY KEY) ON COMMIT DROP;
INSERT INTO stepready_definer (name) VALUES
    ('cancel_task'), ('pause_task'), ('resume_task'), ('retry_step_now'), ('resolve_step'), ('reset_task'),
    ('_step_edges_validate'), ('_step_edges_count'), ('_steps_count_rows'), ('_tasks_run_at'), ('_create_tasks'),
    ('_map_fan_out'),
    -- Signals (SPEC §20): sending writes steps and the mailbox (stepready.signals: every role reads it, with the
    -- other tables; nobody writes it but these functions), which neither clients nor operators may write;
    -- a wait step starting to wait reads and writes the mailbox, from a client's plain INSERT too (the commit-time
    -- trigger) and from a worker's completion of its parent.
    ('send_signal'), ('send_signal_to_key'), ('_wait_enter'), ('_steps_wait_inserted');

DO $roles$
DECLARE
    r        record;
    v_role   text;
    v_river  name;
    v_exists text[];
BEGIN
    SELECT array_agg(rolname::text) INTO v_exists FROM pg_catalog.pg_roles
     WHERE rolname IN ('stepready_client', 'stepready_worker', 'stepready_operator', 'stepready_reader');
    v_exists := COALESCE(v_exists, '{}');

    -- Nothing by default: functions are executable by PUBLIC unless revoked.
    REVOKE ALL ON SCHEMA stepready FROM PUBLIC;
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA stepready FROM PUBLIC;

    -- SECURITY DEFINER as listed; every other function runs with the caller's rights (CREATE OR REPLACE in
    -- package sql already made them so; the ALTER makes the listed ones definers again after every re-creation).
    FOR r IN SELECT p.oid::regprocedure AS fn, d.name IS NOT NULL AS definer
               FROM pg_catalog.pg_proc p LEFT JOIN stepready_definer d ON d.name = p.proname
              WHERE p.pronamespace = 'stepready'::regnamespace LOOP
        IF r.definer THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pg_temp', r.fn);
        END IF;
    END LOOP;

    FOREACH v_role IN ARRAY v_exists LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA stepready TO %I', v_role);
        -- Everyone reads: the task tables (a client reads its tasks; the schema has no tenants), the presets,
        -- the templates, the schedules.
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA stepready TO %I', v_role);
        -- The schema version, which every command and daemon compares with its own at start (migrations.Check).
        IF to_regclass('public.stepready_schema_migrations') IS NOT NULL THEN
            EXECUTE format('GRANT SELECT ON public.stepready_schema_migrations TO %I', v_role);
        END IF;
        -- The wake-up counter (schema version 21): wake_count reads it with the caller's rights; every writer's
        -- trigger advances it (USAGE, granted with the sequences below to the roles that write).
        IF to_regclass('stepready.wakeups') IS NOT NULL THEN
            EXECUTE format('GRANT SELECT ON SEQUENCE stepready.wakeups TO %I', v_role);
        END IF;
        -- Internal helpers: executable by every role (see above).
        FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_catalog.pg_proc p
                  WHERE p.pronamespace = 'stepready'::regnamespace AND p.proname LIKE '\_%'
                    AND p.prorettype <> 'trigger'::regtype LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', r.fn, v_role);
        END LOOP;
        FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_catalog.pg_proc p
                   JOIN stepready_function_roles f ON f.name = p.proname
                  WHERE p.pronamespace = 'stepready'::regnamespace
                    AND substr(v_role, length('stepready_') + 1) = ANY (f.roles) LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', r.fn, v_role);
        END LOOP;
    END LOOP;

    IF 'stepready_client' = ANY (v_exists) THEN
        -- The plain-SQL path of SPEC §2: INSERT only (the triggers do the bookkeeping as definers); create_tasks
        -- draws task ids from the identity sequence.
        GRANT INSERT ON stepready.tasks, stepready.steps, stepready.step_edges TO stepready_client;
        GRANT USAGE ON ALL SEQUENCES IN SCHEMA stepready TO stepready_client;
    END IF;

    IF 'stepready_worker' = ANY (v_exists) THEN
        -- Everything `scheduler run` does: the lifecycle functions write steps, tasks and events with the
        -- daemon's rights; schedules are fired and creating their tasks writes tasks, steps and edges.
        GRANT INSERT, UPDATE, DELETE ON stepready.tasks, stepready.steps, stepready.step_edges,
              stepready.step_events TO stepready_worker;
        GRANT UPDATE ON stepready.schedules TO stepready_worker;
        -- Claims keep the per-key flow control state and the round-robin position (SPEC §14).
        GRANT INSERT, UPDATE ON stepready.flow_state, stepready.flow_cursor TO stepready_worker;
        GRANT DELETE ON stepready.flow_state TO stepready_worker; -- prune_flow_state
        GRANT USAGE ON ALL SEQUENCES IN SCHEMA stepready TO stepready_worker;
        -- River's tables, wherever River was migrated (the schema of river_job).
        SELECT c.relnamespace::regnamespace::name INTO v_river FROM pg_catalog.pg_class c
         WHERE c.relname = 'river_job' AND c.relkind IN ('r', 'p') ORDER BY c.oid LIMIT 1;
        IF v_river IS NOT NULL THEN
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO stepready_worker', v_river);
            FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_catalog.pg_class c
                      WHERE c.relnamespace = v_river::regnamespace AND c.relname LIKE 'river\_%'
                        AND c.relkind IN ('r', 'p', 'S') LOOP
                IF r.relkind = 'S' THEN
                    EXECUTE format('GRANT USAGE, SELECT, UPDATE ON SEQUENCE %s TO stepready_worker', r.rel);
                ELSE
                    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s TO stepready_worker', r.rel);
                END IF;
            END LOOP;
        END IF;
    END IF;

    IF 'stepready_operator' = ANY (v_exists) THEN
        -- Templates and schedules are the operator's to manage; tasks and steps change only through the
        -- operator functions (definers).
        GRANT INSERT, UPDATE, DELETE ON stepready.task_templates, stepready.schedules TO stepready_operator;
        GRANT INSERT, UPDATE, DELETE ON stepready.retry_policies, stepready.failure_classes TO stepready_operator;
        -- Flow control overrides (`scheduler flow set`).
        GRANT INSERT, UPDATE, DELETE ON stepready.flow_limits TO stepready_operator;
        -- Limits kept in the database (SPEC §18: max_output_bytes): changed with UPDATE; the rows are fixed by
        -- the table's CHECK (settings_known_name), so nothing to insert or delete.
        GRANT UPDATE ON stepready.settings TO stepready_operator;
    END IF;
END;
$roles$;
