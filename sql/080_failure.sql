-- Failure handling (SPEC §4, §6, §8): the one decision shared by fail_step and the lease reaper.

-- Normalizes and checks a failure document. Returns it with `class` filled (missing class → transient).
CREATE OR REPLACE FUNCTION stepready._check_error(p_error jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v   jsonb := COALESCE(p_error, '{}');
    ra  jsonb;
BEGIN
    IF jsonb_typeof(v) <> 'object' THEN
        RAISE EXCEPTION 'p_error must be a JSON object, got %', jsonb_typeof(v) USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v -> 'class') NOT IN ('string', 'null') OR v ->> 'class' = '' THEN
        RAISE EXCEPTION 'p_error.class must be a non-empty string, got %', v -> 'class' USING ERRCODE = '22023';
    END IF;
    ra := v -> 'retry_after_ms';
    IF ra IS NOT NULL AND jsonb_typeof(ra) <> 'null'
       AND (jsonb_typeof(ra) <> 'number' OR ra::text::numeric < 0 OR ra::text::numeric > 9223372036854775807) THEN
        RAISE EXCEPTION 'p_error.retry_after_ms must be a number of milliseconds >= 0, got %', ra
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v -> 'retryable') NOT IN ('boolean', 'null') THEN
        RAISE EXCEPTION 'p_error.retryable must be true or false, got %', v -> 'retryable' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v -> 'retry') = 'object' THEN
        -- Only the fields a rule may override for one failure (SPEC §8).
        PERFORM stepready._reject_unknown_keys(v -> 'retry',
            ARRAY['max_attempts', 'backoff', 'base_delay_ms', 'multiplier', 'max_delay_ms', 'jitter'], 'p_error.retry');
    END IF;
    PERFORM stepready._validate_retry(v -> 'retry', 'p_error.retry');
    RETURN v || jsonb_build_object('class', COALESCE(v ->> 'class', 'transient'));
END;
$$;

-- Records a failure of the running attempt of step p_step (locked by the caller, state in_progress) and decides
-- what happens next, in this order: not retryable (class, error or step says so) → error; circuit breaker →
-- error; retries exhausted → error; else waiting_for_retry after the Retry-After delay or the jittered backoff.
-- On error, on_exhausted applies (fail_task | skip | skip_cascade). p_error must have passed _check_error.
CREATE OR REPLACE FUNCTION stepready._apply_failure(p_step stepready.steps, p_error jsonb, p_as_of timestamptz,
                                                    p_sample float8)
RETURNS TABLE (state text, next_attempt_at timestamptz, reason text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_variable
DECLARE
    v          stepready.steps := p_step;
    n          stepready.steps;
    o          jsonb := COALESCE(p_error -> 'retry', '{}');
    v_class    text := p_error ->> 'class';
    c          stepready.failure_classes;
    v_fp       text;
    v_count    int := 0;
    v_reason   text;
    v_state    text;
    v_next     timestamptz;
    v_base     bigint;
    v_delay    bigint;
    v_details  jsonb;
    v_max      int := COALESCE((o ->> 'max_attempts')::numeric::int, p_step.max_attempts);
BEGIN
    SELECT * INTO c FROM stepready.failure_classes fc WHERE fc.name = v_class;
    IF NOT FOUND THEN
        c.retryable := true; -- an unknown class is recorded as given and treated as transient
        c.breaker := false;
    END IF;
    IF c.breaker THEN
        v_fp := stepready._failure_fingerprint(v_class, p_error ->> 'message');
        v_count := CASE WHEN v_fp = v.breaker_fingerprint THEN v.breaker_count + 1 ELSE 1 END;
    END IF;

    IF NOT c.retryable OR (p_error -> 'retryable') = 'false'::jsonb
       OR (NOT COALESCE(v.retryable, true) AND v.attempts >= 1) THEN
        v_reason := 'not_retryable';
    ELSIF c.breaker AND v.breaker_limit > 0 AND v_count >= v.breaker_limit THEN
        v_reason := 'circuit_open';
    ELSIF NOT stepready.retry_eligible(v.attempts, v_max, v.retryable) THEN
        v_reason := 'retries_exhausted';
    END IF;

    v_details := jsonb_build_object('error', p_error, 'class', v_class);
    IF v_fp IS NOT NULL THEN
        v_details := v_details || jsonb_build_object('fingerprint', v_fp, 'breaker_count', v_count);
    END IF;

    IF v_reason IS NULL THEN
        v_state := 'waiting_for_retry';
        IF jsonb_typeof(p_error -> 'retry_after_ms') = 'number' THEN
            -- A delay requested by the handler or the server is used exactly: no jitter, no cap.
            v_delay := trunc((p_error ->> 'retry_after_ms')::numeric)::bigint;
            v_details := v_details || jsonb_build_object('delay_ms', v_delay, 'retry_after_ms', v_delay);
        ELSE
            v_base := stepready.backoff_delay_ms(COALESCE(o ->> 'backoff', v.backoff), v.attempts,
                          COALESCE((o ->> 'base_delay_ms')::numeric::bigint, v.base_delay_ms),
                          COALESCE((o ->> 'multiplier')::float8, v.multiplier),
                          CASE WHEN o ? 'max_delay_ms' THEN (o ->> 'max_delay_ms')::numeric::bigint ELSE v.max_delay_ms END);
            v_delay := stepready._jittered_delay_ms(v_base, COALESCE((o ->> 'jitter')::float8, v.jitter), p_sample);
            v_details := v_details || jsonb_build_object('delay_ms', v_delay, 'backoff_delay_ms', v_base,
                             'jitter', COALESCE((o ->> 'jitter')::float8, v.jitter), 'jitter_sample', p_sample);
        END IF;
        IF o <> '{}'::jsonb THEN
            v_details := v_details || jsonb_build_object('overrides', o);
        END IF;
        -- Clamp so a huge Retry-After cannot overflow the timestamp.
        v_next := p_as_of + LEAST(v_delay, 315360000000000) * interval '1 millisecond';
        v_details := v_details || jsonb_build_object('next_attempt_at', v_next);
    ELSE
        v_state := CASE v.on_exhausted WHEN 'fail_task' THEN 'error' ELSE 'skipped' END;
        v_details := v_details || jsonb_build_object('reason', v_reason, 'on_exhausted', v.on_exhausted);
    END IF;

    UPDATE stepready.steps s
       SET state = v_state,
           next_attempt_at = v_next,
           -- A retry granted only by a max_attempts override must really run: raise the stored budget just
           -- enough for it (as retry_step_now does), so readiness and the claim agree with the decision.
           max_attempts = CASE WHEN v_reason IS NULL
                                    AND NOT stepready.retry_eligible(v.attempts, s.max_attempts, v.retryable)
                               THEN v.attempts + 1 ELSE s.max_attempts END,
           completed_at = CASE WHEN v_reason IS NOT NULL THEN p_as_of END,
           last_error = p_error || jsonb_build_object('reason', v_reason, 'attempt', v.attempts, 'at', p_as_of),
           breaker_fingerprint = v_fp,
           breaker_count = v_count
     WHERE s.id = v.id
    RETURNING * INTO n;

    PERFORM stepready._log(v, 'attempt.failed', 'in_progress', v_state, v_details, p_as_of);
    IF v_reason IS NULL THEN
        PERFORM stepready._log(n, 'retry.scheduled', 'in_progress', v_state, v_details, p_as_of);
    ELSE
        PERFORM stepready._log(n, 'step.failed', 'in_progress', v_state, v_details, p_as_of);
        IF v_state = 'skipped' THEN
            PERFORM stepready._log(n, 'step.skipped', 'in_progress', 'skipped',
                jsonb_build_object('reason', v_reason), p_as_of);
        END IF;
        IF v.on_exhausted = 'skip_cascade' THEN
            PERFORM stepready._skip_descendants(v.id, v.name, p_as_of);
        END IF;
    END IF;

    RETURN QUERY SELECT v_state, v_next, v_reason;
END;
$$;

-- Skips every non-terminal descendant of a step (on_exhausted = skip_cascade), locking in id order.
CREATE OR REPLACE FUNCTION stepready._skip_descendants(p_step_id bigint, p_step_name text, p_as_of timestamptz)
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    d stepready.steps;
    k int := 0;
BEGIN
    FOR d IN
        WITH RECURSIVE below(id) AS (
            SELECT e.child_step_id FROM stepready.step_edges e WHERE e.parent_step_id = p_step_id
            UNION
            SELECT e.child_step_id FROM stepready.step_edges e JOIN below b ON e.parent_step_id = b.id
        )
        SELECT s.* FROM stepready.steps s
         WHERE s.id IN (SELECT id FROM below) AND NOT stepready._is_terminal(s.state)
         ORDER BY s.id
           FOR UPDATE
    LOOP
        UPDATE stepready.steps SET state = 'skipped', next_attempt_at = NULL, completed_at = p_as_of WHERE id = d.id;
        PERFORM stepready._log(d, 'step.skipped', d.state, 'skipped',
            jsonb_build_object('reason', 'ancestor_failed', 'ancestor_step_id', p_step_id,
                               'ancestor', p_step_name), p_as_of);
        k := k + 1;
    END LOOP;
    RETURN k;
END;
$$;

CREATE OR REPLACE FUNCTION stepready.fail_step(
    p_step_id bigint, p_attempt int, p_error jsonb, p_as_of timestamptz DEFAULT now(),
    p_jitter_sample float8 DEFAULT random())
RETURNS TABLE (state text, next_attempt_at timestamptz, reason text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_variable
DECLARE
    v       stepready.steps;
    v_error jsonb;
BEGIN
    IF p_jitter_sample IS NOT NULL AND NOT (p_jitter_sample >= 0 AND p_jitter_sample < 1) THEN
        RAISE EXCEPTION 'p_jitter_sample must be in [0, 1), got %', p_jitter_sample USING ERRCODE = '22023';
    END IF;
    v_error := stepready._check_error(p_error);
    SELECT * INTO v FROM stepready.steps s WHERE s.id = p_step_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::text, NULL::timestamptz, 'stale_attempt'::text;
        RETURN;
    END IF;
    IF v.state <> 'in_progress' OR v.attempts IS DISTINCT FROM p_attempt THEN
        RETURN QUERY SELECT v.state, v.next_attempt_at, 'stale_attempt'::text;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM stepready._apply_failure(v, v_error, p_as_of, COALESCE(p_jitter_sample, 0));
END;
$$;

-- Expired leases: an enqueued step (claimed, never started) goes back to its ready state uncharged; a running
-- attempt fails with class `stalled` through the same decision as fail_step. Rows are locked with SKIP LOCKED
-- and the WHERE clause is re-checked on the locked row, so a step that completed meanwhile is never touched.
CREATE OR REPLACE FUNCTION stepready.reap_expired_leases(p_as_of timestamptz DEFAULT now(), p_limit int DEFAULT 1000)
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    v    stepready.steps;
    v_to text;
    k    int := 0;
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'p_limit must be >= 0, got %', COALESCE(p_limit::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    FOR v IN
        SELECT s.* FROM stepready.steps s
         WHERE s.state IN ('enqueued', 'in_progress') AND s.lease_expires_at < p_as_of
         ORDER BY s.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    LOOP
        v_to := CASE WHEN v.state = 'enqueued' THEN stepready._ready_state(v.attempts) END;
        PERFORM stepready._log(v, 'lease.expired', v.state, v_to,
            jsonb_build_object('lease_owner', v.lease_owner, 'lease_expires_at', v.lease_expires_at), p_as_of);
        IF v.state = 'enqueued' THEN
            UPDATE stepready.steps SET state = v_to WHERE id = v.id;
        ELSE
            PERFORM stepready._apply_failure(v,
                jsonb_build_object('class', 'stalled',
                    'message', format('lease of attempt %s held by %s expired at %s', v.attempts,
                                      COALESCE(v.lease_owner, 'unknown worker'), v.lease_expires_at)),
                p_as_of, random());
        END IF;
        k := k + 1;
    END LOOP;
    RETURN k;
END;
$$;
