-- The step_events history. Every lifecycle and operator function appends through _log so rows are uniform.

-- Appends one event for step p_step (its task, attempt and iteration as stored in the row passed in).
CREATE OR REPLACE FUNCTION stepready._log(p_step stepready.steps, p_event text, p_from text, p_to text,
                                          p_details jsonb, p_at timestamptz)
RETURNS void
LANGUAGE plpgsql -- not sql: PL/pgSQL caches the INSERT's plan, a SQL function would plan it on every call
AS $$
BEGIN
    INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state, details, at)
    VALUES (p_step.task_id, p_step.id, p_step.attempts, p_step.iteration, p_event, p_from, p_to,
            COALESCE(p_details, '{}'), COALESCE(p_at, clock_timestamp()));
END;
$$;

-- _lock_step locked one step for the step-level operators, which now lock their whole task (_lock_step_and_task,
-- sql/090_operators.sql: one lock order).
DROP FUNCTION IF EXISTS stepready._lock_step(bigint);

-- Checks the p_limit argument of the functions that handle at most p_limit rows (the claims, the reaper, the
-- prunes): 0 or more, named in the message after p_prefix (the function's name and ': ', or '').
CREATE OR REPLACE FUNCTION stepready._check_limit(p_limit int, p_prefix text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION '%p_limit must be >= 0, got %', p_prefix, COALESCE(p_limit::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Validates the common arguments of the lifecycle functions.
CREATE OR REPLACE FUNCTION stepready._check_lease_args(p_worker text, p_lease_ms bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_worker IS NULL OR p_worker = '' THEN
        RAISE EXCEPTION 'p_worker must be a non-empty worker id' USING ERRCODE = '22023';
    END IF;
    IF p_lease_ms IS NULL OR p_lease_ms <= 0 THEN
        RAISE EXCEPTION 'p_lease_ms must be > 0, got %', COALESCE(p_lease_ms::text, 'NULL') USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Events go with their task or step. step_events has no foreign keys (they cost two lookups and two row locks per
-- event, for rows the inserting function holds locked anyway): these statement triggers delete the events of
-- deleted tasks and steps, and a TRUNCATE of tasks or steps takes their events along.
-- Lookups by key whatever the statistics say: the transition table has none, and step_events is the largest table.
CREATE OR REPLACE FUNCTION stepready._delete_events()
RETURNS trigger
LANGUAGE plpgsql
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        IF TG_TABLE_NAME = 'tasks' THEN
            DELETE FROM stepready.step_events;
        ELSE
            DELETE FROM stepready.step_events WHERE step_id IS NOT NULL;
        END IF;
    ELSIF TG_TABLE_NAME = 'tasks' THEN
        DELETE FROM stepready.step_events WHERE task_id IN (SELECT g.id FROM gone g);
    ELSE
        -- By task and step: step_events is indexed by task only (a step's events are always read with its task).
        DELETE FROM stepready.step_events e USING gone g WHERE e.task_id = g.task_id AND e.step_id = g.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER tasks_delete_events
    AFTER DELETE ON stepready.tasks
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._delete_events();

CREATE OR REPLACE TRIGGER steps_delete_events
    AFTER DELETE ON stepready.steps
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._delete_events();

CREATE OR REPLACE TRIGGER tasks_truncate_events
    AFTER TRUNCATE ON stepready.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._delete_events();

CREATE OR REPLACE TRIGGER steps_truncate_events
    AFTER TRUNCATE ON stepready.steps
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._delete_events();

-- Rejects an id list with a NULL or a repeated id (the batch lifecycle functions take one entry per step).
CREATE OR REPLACE FUNCTION stepready._check_step_ids(p_step_ids bigint[], p_name text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_dup bigint;
BEGIN
    IF p_step_ids IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', p_name USING ERRCODE = '22023';
    END IF;
    IF array_position(p_step_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION '% contains NULL at position %', p_name, array_position(p_step_ids, NULL)
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_step_ids) > 1 THEN
        SELECT x INTO v_dup FROM unnest(p_step_ids) AS x GROUP BY x HAVING count(*) > 1 LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION '% contains step % more than once', p_name, v_dup USING ERRCODE = '22023';
        END IF;
    END IF;
END;
$$;

-- Rejects a parallel array of a batch function (p_name, of p_len entries, NULL when the array is NULL) that does
-- not have one entry per step id.
CREATE OR REPLACE FUNCTION stepready._check_entries(p_step_ids bigint[], p_len int, p_name text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_len IS NULL OR p_len <> cardinality(p_step_ids) THEN
        RAISE EXCEPTION '% must have one entry per step id (%), got %', p_name, cardinality(p_step_ids),
            COALESCE(p_len::text, 'NULL') USING ERRCODE = '22023';
    END IF;
END;
$$;
