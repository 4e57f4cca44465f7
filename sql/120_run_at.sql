-- Delayed start (SPEC §15): tasks.run_at. No step of a task is claimable before its run_at. The rule is carried
-- by the steps' next_attempt_at (SPEC §2: it also delays a first attempt): _steps_materialize (020_policy.sql)
-- sets it to run_at for every step inserted pending with no attempt yet (create_tasks writes it so itself, and
-- parses run_at: _run_at_problem, 100_definitions.sql), and the trigger below moves it when
-- run_at changes. So the claim index, claim_ready_steps and next_claim_at work unchanged and stay O(ready); a
-- task scheduled for next year is one index entry per step, skipped inside the index, until then.
-- step_readiness reports `scheduled` (050_readiness.sql) and explain says when (110_explain.sql).

-- run_at changed on an existing task (plain SQL, or an operator rescheduling it): steps that have not started
-- their first attempt follow it. Steps already run, or repeating, keep their own next_attempt_at.
CREATE OR REPLACE FUNCTION stepready._tasks_run_at()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE stepready.steps s
       SET next_attempt_at = NEW.run_at, updated_at = now()
     WHERE s.task_id = NEW.id AND s.state = 'pending' AND s.attempts = 0 AND s.iteration = 0
       AND s.next_attempt_at IS DISTINCT FROM NEW.run_at;
    -- A new future start is a new wake-up time for the daemons (a start moved to now or earlier notifies through
    -- steps_after_update already).
    IF NEW.run_at > now() THEN
        PERFORM stepready._notify_ready(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER tasks_run_at
    AFTER UPDATE OF run_at ON stepready.tasks
    FOR EACH ROW WHEN (OLD.run_at IS DISTINCT FROM NEW.run_at)
    EXECUTE FUNCTION stepready._tasks_run_at();

-- A task created with a future run_at has no step claimable now, so steps_notify stays silent; but the daemons'
-- wake-up timer (next_claim_at, read after every claim) must learn the new time, or they would start it only at
-- their next poll. One notification per such task, at commit; tasks without run_at pay nothing (WHEN clause), and
-- neither do the tasks of create_tasks, which notifies every task it creates itself.
CREATE OR REPLACE FUNCTION stepready._tasks_notify_run_at()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM stepready._notify_ready(ARRAY[NEW.id]);
    RETURN NULL;
END;
$$;

DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE OR REPLACE TRIGGER tasks_notify_run_at
    AFTER INSERT ON stepready.tasks
    FOR EACH ROW WHEN (NEW.run_at IS NOT NULL AND NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._tasks_notify_run_at()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;
