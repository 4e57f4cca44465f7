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

-- Raises the standard "no such step" error (P0002) unless the step exists; returns the row locked.
CREATE OR REPLACE FUNCTION stepready._lock_step(p_step_id bigint)
RETURNS stepready.steps
LANGUAGE plpgsql
AS $$
DECLARE
    v stepready.steps;
BEGIN
    SELECT * INTO v FROM stepready.steps WHERE id = p_step_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'step % does not exist', p_step_id USING ERRCODE = 'P0002';
    END IF;
    RETURN v;
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
