-- Settings the hot-path functions pin (docs/design-core.md, "Settings the functions pin"). Applied last, after
-- every file has (re)created its functions, because CREATE OR REPLACE FUNCTION resets a function's settings.
--
-- jit = off. The statements of these functions read a handful of rows each, by index, and run in well under a
-- millisecond; JIT compilation of one statement costs several milliseconds. PostgreSQL decides to compile when
-- the planner's cost estimate passes jit_above_cost (100,000 by default), and estimates follow the statistics:
-- with statistics gathered while a table was filling up, the cycle check of the edge trigger was estimated at
-- about 316,000 and compiled for every edge (issue 20). Turning JIT off for the duration of each call, for every
-- statement it runs, nested ones and the foreign-key checks and triggers it fires included, takes the planner's
-- opinion out of it. It does not touch the caller's own queries, and costs a setting change per call (a few
-- microseconds); PostgreSQL checks the setting at execution, so a plan cached while JIT was on is not compiled
-- either.
--
-- The entry points of creation (create_task(s), from templates too; _create_tasks and _validate_definitions pin
-- it in their own definitions, with the planner settings that make their plans index-driven), of claiming and
-- starting, of recording outcomes, of reaping; and the trigger functions that plain INSERTs and UPDATEs fire
-- (the plain-SQL creation path of SPEC §2 runs them outside any function of ours).
DO $pin$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'stepready'::regnamespace
           AND p.proname IN (
               -- creation
               'create_task', 'create_tasks', 'create_task_from_template', 'create_tasks_from_template',
               -- claim, start, outcomes, leases
               'claim_ready_steps', 'claim_and_start_steps', 'next_claim_at', 'next_flow_at', 'start_step',
               'start_steps', 'heartbeat_step', 'complete_step', 'complete_steps', 'fail_step', 'fail_steps',
               'continue_step', 'release_step', 'reap_expired_leases',
               -- triggers of plain INSERTs and UPDATEs
               '_steps_materialize', '_tasks_validate_retry', '_tasks_notify_run_at', '_step_edges_validate',
               '_step_edges_count', '_steps_count_rows', '_steps_notify', '_steps_after_update',
               '_steps_delete_edges', '_steps_check_refs',
               -- signals and wait steps (sql/059_signals.sql): the claims' timers, a wait's start, a delivery
               'send_signal', 'send_signal_to_key', '_fire_due_waits', '_wait_enter', '_signal_deliver', '_wait_fail',
               '_steps_wait_inserted')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET jit = off', r.fn);
    END LOOP;
END;
$pin$;
