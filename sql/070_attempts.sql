-- The attempt lifecycle after a claim (SPEC §6): start, heartbeat, complete, continue, release.
-- Every write is fenced on (step, attempt, state): a late or duplicate call changes nothing and returns
-- false / NULL.

-- The state a step returns to when an attempt is handed back uncharged.
CREATE OR REPLACE FUNCTION stepready._ready_state(p_attempts int)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN COALESCE(p_attempts, 0) = 0 THEN 'pending' ELSE 'waiting_for_retry' END;
$$;

-- Combines an iteration's output with what earlier iterations collected. p_iteration = 0 means there is no
-- earlier iteration, whatever p_previous holds.
CREATE OR REPLACE FUNCTION stepready._collect(p_collect text, p_previous jsonb, p_output jsonb, p_iteration int,
                                              p_step_id bigint)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_prev jsonb := CASE WHEN COALESCE(p_iteration, 0) > 0 THEN p_previous END;
BEGIN
    CASE p_collect
        WHEN 'append' THEN
            IF v_prev IS NULL OR jsonb_typeof(v_prev) <> 'array' THEN
                v_prev := '[]';
            END IF;
            RETURN v_prev || jsonb_build_array(p_output);
        WHEN 'merge' THEN
            IF p_output IS NOT NULL AND jsonb_typeof(p_output) <> 'object' THEN
                RAISE EXCEPTION 'step %: collect = merge needs a JSON object output, got %', p_step_id,
                    jsonb_typeof(p_output) USING ERRCODE = '22023';
            END IF;
            IF v_prev IS NULL OR jsonb_typeof(v_prev) <> 'object' THEN
                v_prev := '{}';
            END IF;
            RETURN v_prev || COALESCE(p_output, '{}');
        ELSE
            RETURN p_output;
    END CASE;
END;
$$;

-- enqueued → in_progress: charges the attempt and returns its number, the fencing token every later call of
-- this attempt carries. NULL when the step is not enqueued any more (cancelled, reaped, started elsewhere) or
-- its task stopped being runnable since the claim (the step then goes back to its ready state, uncharged).
CREATE OR REPLACE FUNCTION stepready.start_step(
    p_step_id bigint, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    v    stepready.steps;
    v_to text;
    t    stepready.tasks;
BEGIN
    PERFORM stepready._check_lease_args(p_worker, p_lease_ms);
    SELECT * INTO v FROM stepready.steps WHERE id = p_step_id FOR UPDATE;
    IF NOT FOUND OR v.state <> 'enqueued' THEN
        RETURN NULL;
    END IF;
    SELECT * INTO t FROM stepready.tasks WHERE id = v.task_id;
    IF t.paused OR t.status NOT IN ('pending', 'in_progress') THEN
        v_to := stepready._ready_state(v.attempts);
        UPDATE stepready.steps SET state = v_to WHERE id = v.id;
        PERFORM stepready._log(v, 'step.released', 'enqueued', v_to,
            jsonb_build_object('reason', CASE WHEN t.paused THEN 'task_paused' ELSE 'task_not_active' END,
                               'task_status', t.status, 'worker', p_worker), p_as_of);
        RETURN NULL;
    END IF;
    UPDATE stepready.steps
       SET state = 'in_progress',
           attempts = attempts + 1,
           last_attempted_at = p_as_of,
           lease_owner = p_worker,
           lease_expires_at = p_as_of + p_lease_ms * interval '1 millisecond'
     WHERE id = v.id
    RETURNING * INTO v;
    PERFORM stepready._log(v, 'attempt.started', 'enqueued', 'in_progress',
        jsonb_build_object('worker', p_worker, 'lease_expires_at', v.lease_expires_at), p_as_of);
    RETURN v.attempts;
END;
$$;

-- Extends the lease of a running attempt. False when the attempt is no longer the running one.
CREATE OR REPLACE FUNCTION stepready.heartbeat_step(
    p_step_id bigint, p_attempt int, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_lease_ms IS NULL OR p_lease_ms <= 0 THEN
        RAISE EXCEPTION 'p_lease_ms must be > 0, got %', COALESCE(p_lease_ms::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    UPDATE stepready.steps
       SET lease_expires_at = p_as_of + p_lease_ms * interval '1 millisecond'
     WHERE id = p_step_id AND state = 'in_progress' AND attempts = p_attempt;
    RETURN FOUND;
END;
$$;

-- in_progress → complete with the attempt's output (collected per the step's collect mode).
CREATE OR REPLACE FUNCTION stepready.complete_step(
    p_step_id bigint, p_attempt int, p_output jsonb, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    v stepready.steps;
    n stepready.steps;
BEGIN
    SELECT * INTO v FROM stepready.steps WHERE id = p_step_id FOR UPDATE;
    IF NOT FOUND OR v.state <> 'in_progress' OR v.attempts IS DISTINCT FROM p_attempt THEN
        RETURN false;
    END IF;
    UPDATE stepready.steps
       SET state = 'complete',
           output = stepready._collect(v.collect, v.output, p_output, v.iteration, v.id),
           completed_at = p_as_of,
           next_attempt_at = NULL
     WHERE id = v.id
    RETURNING * INTO n;
    PERFORM stepready._log(v, 'attempt.succeeded', 'in_progress', 'complete', '{}', p_as_of);
    PERFORM stepready._log(n, 'step.completed', 'in_progress', 'complete', '{}', p_as_of);
    RETURN true;
END;
$$;

-- Success-side repetition (polling, pagination): the attempt succeeded and the step runs again with a new
-- input after p_delay_ms, with a fresh retry budget. Reaching max_iterations completes the step instead.
CREATE OR REPLACE FUNCTION stepready.continue_step(
    p_step_id bigint, p_attempt int, p_output jsonb, p_next_input jsonb, p_delay_ms bigint,
    p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    v         stepready.steps;
    n         stepready.steps;
    v_output  jsonb;
    v_next    int;
    v_delay   bigint := COALESCE(p_delay_ms, 0);
BEGIN
    IF v_delay < 0 THEN
        RAISE EXCEPTION 'p_delay_ms must be >= 0, got %', p_delay_ms USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v FROM stepready.steps WHERE id = p_step_id FOR UPDATE;
    IF NOT FOUND OR v.state <> 'in_progress' OR v.attempts IS DISTINCT FROM p_attempt THEN
        RETURN false;
    END IF;
    v_output := stepready._collect(v.collect, v.output, p_output, v.iteration, v.id);
    v_next := v.iteration + 1;
    PERFORM stepready._log(v, 'attempt.succeeded', 'in_progress', NULL, '{}', p_as_of);

    IF v_next >= COALESCE(v.max_iterations, 1000) THEN
        UPDATE stepready.steps
           SET state = 'complete', output = v_output, completed_at = p_as_of, next_attempt_at = NULL
         WHERE id = v.id
        RETURNING * INTO n;
        PERFORM stepready._log(n, 'step.completed', 'in_progress', 'complete',
            jsonb_build_object('reason', 'max_iterations', 'max_iterations', COALESCE(v.max_iterations, 1000)),
            p_as_of);
        RETURN true;
    END IF;

    UPDATE stepready.steps
       SET state = 'pending',
           iteration = v_next,
           attempts = 0,
           input = COALESCE(p_next_input, v.input),
           output = v_output,
           next_attempt_at = p_as_of + v_delay * interval '1 millisecond',
           breaker_fingerprint = NULL,
           breaker_count = 0
     WHERE id = v.id
    RETURNING * INTO n;
    PERFORM stepready._log(n, 'iteration.continued', 'in_progress', 'pending',
        jsonb_build_object('delay_ms', v_delay, 'next_attempt_at', n.next_attempt_at,
                           'input_replaced', p_next_input IS NOT NULL), p_as_of);
    RETURN true;
END;
$$;

-- Hands an attempt back uncharged (graceful shutdown): in_progress with this attempt, or enqueued and never
-- started (p_attempt NULL or equal to the current attempts count). The step is immediately ready again.
CREATE OR REPLACE FUNCTION stepready.release_step(p_step_id bigint, p_attempt int, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    v          stepready.steps;
    n          stepready.steps;
    v_attempts int;
BEGIN
    SELECT * INTO v FROM stepready.steps WHERE id = p_step_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    ELSIF v.state = 'in_progress' AND v.attempts = p_attempt THEN
        v_attempts := v.attempts - 1;
    ELSIF v.state = 'enqueued' AND (p_attempt IS NULL OR p_attempt = v.attempts) THEN
        v_attempts := v.attempts;
    ELSE
        RETURN false;
    END IF;
    UPDATE stepready.steps
       SET state = stepready._ready_state(v_attempts), attempts = v_attempts
     WHERE id = v.id
    RETURNING * INTO n;
    PERFORM stepready._log(v, 'step.released', v.state, n.state,
        jsonb_build_object('uncharged', true, 'worker', v.lease_owner), p_as_of);
    RETURN true;
END;
$$;
