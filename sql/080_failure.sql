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
    -- Most documents have no overrides: check them only when present (a call per failure otherwise).
    IF v ? 'retry' THEN
        IF jsonb_typeof(v -> 'retry') = 'object' THEN
            -- Only the fields a rule may override for one failure (SPEC §8).
            PERFORM stepready._reject_unknown_keys(v -> 'retry',
                ARRAY['max_attempts', 'backoff', 'base_delay_ms', 'multiplier', 'max_delay_ms', 'jitter'],
                'p_error.retry');
        END IF;
        PERFORM stepready._validate_retry(v -> 'retry', 'p_error.retry');
    END IF;
    RETURN v || jsonb_build_object('class', COALESCE(v ->> 'class', 'transient'));
END;
$$;

-- Records failures of running attempts (steps locked by the caller, each in_progress; entry i is step
-- p_step_ids[i] with error p_errors[i], already through _check_error, and jitter sample p_samples[i]) and decides
-- what happens next to each, in this order: not retryable (class, error or step says so) → error; circuit
-- breaker → error; retries exhausted → error; else waiting_for_retry after the Retry-After delay or the jittered
-- backoff. On error, on_exhausted applies (fail_task | skip | skip_cascade). Set-based: one update and one insert
-- of events for the whole batch; skip_cascade then skips descendants step by step. Rows come back in no
-- particular order.
CREATE OR REPLACE FUNCTION stepready._apply_failures(p_step_ids bigint[], p_errors jsonb[], p_as_of timestamptz,
                                                     p_samples float8[])
RETURNS TABLE (step_id bigint, state text, next_attempt_at timestamptz, reason text)
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ids     bigint[];
    v_states  text[];
    v_next    timestamptz[];
    v_reasons text[];
    v_cascade bigint[];
    v_names   text[];
    i         int;
BEGIN
    -- The CTEs that compute something used further on are MATERIALIZED: PostgreSQL inlines a CTE referenced once,
    -- which copies its expressions into every place that uses them, so a failure-class lookup or the fingerprint's
    -- regular expression ran dozens of times per row (measured: 98 µs per failure, now a few).
    WITH facts AS MATERIALIZED (
        SELECT u.id, u.err, COALESCE(u.err -> 'retry', '{}'::jsonb) AS o, u.err ->> 'class' AS cls, u.sample,
               COALESCE(jsonb_typeof(u.err -> 'retry_after_ms') = 'number', false) AS has_ra,
               s.task_id, s.name, s.attempts, s.iteration, s.retryable AS s_retryable, s.max_attempts AS s_max,
               s.backoff, s.base_delay_ms, s.multiplier, s.max_delay_ms, s.jitter, s.breaker_limit,
               s.breaker_fingerprint AS s_fp, s.breaker_count AS s_count, s.on_exhausted,
               -- what a step entering waiting_for_retry copies from its task (as _steps_before_update would)
               t.paused OR t.status NOT IN ('pending', 'in_progress') AS t_held, t.priority AS t_priority,
               -- an unknown class is recorded as given and treated as transient
               COALESCE(fc.retryable, true) AS c_retryable, COALESCE(fc.breaker, false) AS c_breaker,
               CASE WHEN fc.breaker THEN stepready._failure_fingerprint(u.err ->> 'class', u.err ->> 'message') END AS fp
          FROM unnest(p_step_ids, p_errors, p_samples) AS u(id, err, sample)
          JOIN stepready.steps s ON s.id = u.id
          JOIN stepready.tasks t ON t.id = s.task_id
          LEFT JOIN stepready.failure_classes fc ON fc.name = u.err ->> 'class'
    ), decided AS MATERIALIZED (
        SELECT f.*, CASE WHEN f.fp IS NULL THEN 0 WHEN f.fp = f.s_fp THEN f.s_count + 1 ELSE 1 END AS streak_count
          FROM facts f
    ), reasoned AS (
        SELECT d.*,
               CASE
                   WHEN NOT d.c_retryable OR (d.err -> 'retryable') = 'false'::jsonb
                        OR (NOT COALESCE(d.s_retryable, true) AND d.attempts >= 1) THEN 'not_retryable'
                   WHEN d.c_breaker AND d.breaker_limit > 0 AND d.streak_count >= d.breaker_limit THEN 'circuit_open'
                   WHEN NOT stepready.retry_eligible(d.attempts,
                            COALESCE((d.o ->> 'max_attempts')::numeric::int, d.s_max), d.s_retryable)
                       THEN 'retries_exhausted'
               END AS why
          FROM decided d
    ), based AS MATERIALIZED (
        SELECT r.*,
               CASE WHEN r.why IS NULL AND NOT r.has_ra THEN
                   stepready.backoff_delay_ms(COALESCE(r.o ->> 'backoff', r.backoff), r.attempts,
                       COALESCE((r.o ->> 'base_delay_ms')::numeric::bigint, r.base_delay_ms),
                       COALESCE((r.o ->> 'multiplier')::float8, r.multiplier),
                       CASE WHEN r.o ? 'max_delay_ms' THEN (r.o ->> 'max_delay_ms')::numeric::bigint
                            ELSE r.max_delay_ms END)
               END AS base,
               COALESCE((r.o ->> 'jitter')::float8, r.jitter) AS jit
          FROM reasoned r
    ), delayed AS (
        SELECT b.*,
               CASE WHEN b.why IS NOT NULL THEN NULL
                    -- A delay requested by the handler or the server is used exactly: no jitter, no cap.
                    WHEN b.has_ra THEN trunc((b.err ->> 'retry_after_ms')::numeric)::bigint
                    ELSE stepready._jittered_delay_ms(b.base, b.jit, b.sample) END AS delay
          FROM based b
    ), final AS (
        SELECT d.*,
               CASE WHEN d.why IS NOT NULL THEN CASE d.on_exhausted WHEN 'fail_task' THEN 'error' ELSE 'skipped' END
                    ELSE 'waiting_for_retry' END AS new_state,
               -- Clamp so a huge Retry-After cannot overflow the timestamp (LEAST ignores a NULL: test it first).
               CASE WHEN d.delay IS NOT NULL
                    THEN p_as_of + LEAST(d.delay, 315360000000000) * interval '1 millisecond' END AS next_at
          FROM delayed d
    ), detailed AS (
        SELECT f.*,
               jsonb_build_object('error', f.err, 'class', f.cls)
               || CASE WHEN f.fp IS NOT NULL THEN jsonb_build_object('fingerprint', f.fp, 'breaker_count', f.streak_count)
                       ELSE '{}'::jsonb END
               || CASE WHEN f.why IS NOT NULL THEN jsonb_build_object('reason', f.why, 'on_exhausted', f.on_exhausted)
                       WHEN f.has_ra THEN jsonb_build_object('delay_ms', f.delay, 'retry_after_ms', f.delay)
                       ELSE jsonb_build_object('delay_ms', f.delay, 'backoff_delay_ms', f.base, 'jitter', f.jit,
                                               'jitter_sample', f.sample) END
               || CASE WHEN f.why IS NULL AND f.o <> '{}'::jsonb THEN jsonb_build_object('overrides', f.o)
                       ELSE '{}'::jsonb END
               || CASE WHEN f.why IS NULL THEN jsonb_build_object('next_attempt_at', f.next_at) ELSE '{}'::jsonb END
               AS details
          FROM final f
    ), updated AS (
        UPDATE stepready.steps s
           SET state = x.new_state,
               next_attempt_at = x.next_at,
               -- A retry granted only by a max_attempts override must really run: raise the stored budget just
               -- enough for it (as retry_step_now does), so readiness and the claim agree with the decision.
               max_attempts = CASE WHEN x.why IS NULL
                                        AND NOT stepready.retry_eligible(x.attempts, s.max_attempts, x.s_retryable)
                                   THEN x.attempts + 1 ELSE s.max_attempts END,
               completed_at = CASE WHEN x.why IS NOT NULL THEN p_as_of END,
               updated_at = now(),
               lease_owner = NULL,
               lease_expires_at = NULL,
               last_error = x.err || jsonb_build_object('reason', x.why, 'attempt', x.attempts, 'at', p_as_of),
               breaker_fingerprint = x.fp,
               breaker_count = x.streak_count,
               task_held = CASE WHEN x.why IS NULL THEN x.t_held ELSE s.task_held END,
               task_priority = CASE WHEN x.why IS NULL THEN x.t_priority ELSE s.task_priority END
          FROM detailed x
         WHERE s.id = x.id
        RETURNING s.id
    ), logged AS (
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT x.task_id, x.id, x.attempts, x.iteration, e.event, 'in_progress', e.to_state, e.details, p_as_of
          FROM detailed x
         CROSS JOIN LATERAL (VALUES
                   (1, 'attempt.failed', x.new_state, x.details),
                   (2, CASE WHEN x.why IS NULL THEN 'retry.scheduled' ELSE 'step.failed' END, x.new_state, x.details),
                   (3, CASE WHEN x.new_state = 'skipped' THEN 'step.skipped' END, 'skipped',
                       jsonb_build_object('reason', x.why))) AS e(n, event, to_state, details)
         WHERE e.event IS NOT NULL
         ORDER BY x.id, e.n
    )
    SELECT array_agg(x.id), array_agg(x.new_state), array_agg(x.next_at), array_agg(x.why),
           array_agg(x.id ORDER BY x.id) FILTER (WHERE x.why IS NOT NULL AND x.on_exhausted = 'skip_cascade'),
           array_agg(x.name ORDER BY x.id) FILTER (WHERE x.why IS NOT NULL AND x.on_exhausted = 'skip_cascade')
      INTO v_ids, v_states, v_next, v_reasons, v_cascade, v_names
      FROM detailed x;

    IF v_cascade IS NOT NULL THEN
        FOR i IN 1 .. cardinality(v_cascade) LOOP
            PERFORM stepready._skip_descendants(v_cascade[i], v_names[i], p_as_of);
        END LOOP;
    END IF;
    RETURN QUERY SELECT u.id, u.st, u.nx, u.rs FROM unnest(v_ids, v_states, v_next, v_reasons) AS u(id, st, nx, rs);
END;
$$;

-- One failure (the lease reaper's): _apply_failures of a one-element batch. p_step is locked by the caller.
CREATE OR REPLACE FUNCTION stepready._apply_failure(p_step stepready.steps, p_error jsonb, p_as_of timestamptz,
                                                    p_sample float8)
RETURNS TABLE (state text, next_attempt_at timestamptz, reason text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY SELECT a.state, a.next_attempt_at, a.reason
                   FROM stepready._apply_failures(ARRAY[p_step.id], ARRAY[p_error], p_as_of, ARRAY[p_sample]) a;
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

-- fail_step for a batch of failed attempts: entry i is step p_step_ids[i], attempt p_attempts[i], error document
-- p_errors[i] and jitter sample p_jitter_samples[i] (the whole array NULL: random() per entry; an element NULL:
-- 0, as fail_step's NULL sample). Each entry is fenced on its fencing token and decided exactly as fail_step does
-- it; rows are locked in ascending id. One row per entry, in no particular order: a fenced entry changes nothing
-- but the end of its attempt's orphaned lease (_end_orphans) and gets its step's current state and
-- next_attempt_at with reason stale_attempt (NULL, NULL, stale_attempt for a step that does not exist).
CREATE OR REPLACE FUNCTION stepready.fail_steps(
    p_step_ids bigint[], p_attempts int[], p_errors jsonb[], p_as_of timestamptz DEFAULT now(),
    p_jitter_samples float8[] DEFAULT NULL)
RETURNS TABLE (step_id bigint, state text, next_attempt_at timestamptz, reason text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan -- see start_steps
AS $$
#variable_conflict use_column
DECLARE
    v_errors  jsonb[];
    v_samples float8[];
    v_bad     int;
    v_ok      bigint[];
    v_ok_err  jsonb[];
    v_ok_smp  float8[];
BEGIN
    PERFORM stepready._check_step_ids(p_step_ids, 'p_step_ids');
    PERFORM stepready._check_entries(p_step_ids, cardinality(p_attempts), 'p_attempts');
    PERFORM stepready._check_entries(p_step_ids, cardinality(p_errors), 'p_errors');
    IF p_jitter_samples IS NOT NULL AND cardinality(p_jitter_samples) <> cardinality(p_step_ids) THEN
        RAISE EXCEPTION 'p_jitter_samples must be NULL or have one entry per step id (%), got %',
            cardinality(p_step_ids), cardinality(p_jitter_samples) USING ERRCODE = '22023';
    END IF;
    v_samples := ARRAY(SELECT CASE WHEN p_jitter_samples IS NULL THEN random() ELSE COALESCE(x, 0) END
                         FROM unnest(COALESCE(p_jitter_samples, array_fill(NULL::float8, ARRAY[cardinality(p_step_ids)])))
                              WITH ORDINALITY AS u(x, k) ORDER BY k);
    SELECT min(k) INTO v_bad FROM unnest(v_samples) WITH ORDINALITY AS u(x, k) WHERE NOT (x >= 0 AND x < 1);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'p_jitter_samples[%] must be in [0, 1), got %', v_bad, v_samples[v_bad]
            USING ERRCODE = '22023';
    END IF;
    v_errors := ARRAY(SELECT stepready._check_error(e) FROM unnest(p_errors) WITH ORDINALITY AS u(e, k) ORDER BY k);

    -- Lock every requested row in id order (by primary key only), then fence each entry on its locked row.
    PERFORM 1 FROM stepready.steps s WHERE s.id = ANY (p_step_ids) ORDER BY s.id FOR UPDATE;
    SELECT array_agg(u.id), array_agg(u.err), array_agg(u.smp)
      INTO v_ok, v_ok_err, v_ok_smp
      FROM unnest(p_step_ids, p_attempts, v_errors, v_samples) AS u(id, attempt, err, smp)
     WHERE (SELECT s.state = 'in_progress' AND s.fence_token = u.attempt FROM stepready.steps s WHERE s.id = u.id);

    IF v_ok IS NOT NULL THEN
        RETURN QUERY SELECT * FROM stepready._apply_failures(v_ok, v_ok_err, p_as_of, v_ok_smp);
    END IF;
    IF COALESCE(cardinality(v_ok), 0) < cardinality(p_step_ids) THEN
        -- Fenced entries (never on the hot path): the end of the refused attempts' orphaned leases.
        PERFORM stepready._end_orphans(array_agg(x.id), array_agg(x.attempt))
           FROM unnest(p_step_ids, p_attempts) AS x(id, attempt)
          WHERE x.id IN (SELECT f FROM unnest(p_step_ids) AS f EXCEPT ALL SELECT y FROM unnest(v_ok) AS y);
    END IF;
    -- EXCEPT hashes (see complete_steps).
    RETURN QUERY SELECT f.id, s.state, s.next_attempt_at, 'stale_attempt'::text
                   FROM (SELECT x FROM unnest(p_step_ids) AS x EXCEPT ALL SELECT y FROM unnest(v_ok) AS y) AS f(id)
                   LEFT JOIN stepready.steps s ON s.id = f.id;
END;
$$;

-- One failed attempt: fail_steps of a one-element batch.
CREATE OR REPLACE FUNCTION stepready.fail_step(
    p_step_id bigint, p_attempt int, p_error jsonb, p_as_of timestamptz DEFAULT now(),
    p_jitter_sample float8 DEFAULT random())
RETURNS TABLE (state text, next_attempt_at timestamptz, reason text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    IF p_jitter_sample IS NOT NULL AND NOT (p_jitter_sample >= 0 AND p_jitter_sample < 1) THEN
        RAISE EXCEPTION 'p_jitter_sample must be in [0, 1), got %', p_jitter_sample USING ERRCODE = '22023';
    END IF;
    PERFORM stepready._check_error(p_error);
    IF p_step_id IS NULL THEN
        RETURN QUERY SELECT NULL::text, NULL::timestamptz, 'stale_attempt'::text;
        RETURN;
    END IF;
    RETURN QUERY SELECT f.state, f.next_attempt_at, f.reason
                   FROM stepready.fail_steps(ARRAY[p_step_id], ARRAY[p_attempt], ARRAY[p_error], p_as_of,
                                             ARRAY[COALESCE(p_jitter_sample, 0)]) f;
END;
$$;

-- Expired leases: an enqueued step (claimed, never started) goes back to its ready state uncharged; a running
-- attempt fails with class `stalled` through the same decision as fail_step; an orphaned lease (its step moved out
-- of flight by an operator while the attempt ran: sql/046_leases.sql) is cleared, with a lease.expired event
-- (its slot was free since it expired: the in-flight count tests the expiry itself; clearing it keeps the
-- index of slots small and notifies a full key's daemons). Rows are locked with SKIP LOCKED and the WHERE clause
-- is re-checked on the locked row, so a step that completed meanwhile is never touched. At most p_limit rows in
-- all; returns how many were handled.
CREATE OR REPLACE FUNCTION stepready.reap_expired_leases(p_as_of timestamptz DEFAULT now(), p_limit int DEFAULT 1000)
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    v    stepready.steps;
    v_to text;
    k    int := 0;
BEGIN
    PERFORM stepready._check_limit(p_limit, '');
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
            UPDATE stepready.steps SET state = v_to, lease_owner = NULL, lease_expires_at = NULL WHERE id = v.id;
        ELSE
            PERFORM stepready._apply_failure(v,
                jsonb_build_object('class', 'stalled',
                    'message', format('lease of attempt %s held by %s expired at %s', v.attempts,
                                      COALESCE(v.lease_owner, 'unknown worker'), v.lease_expires_at)),
                p_as_of, random());
        END IF;
        k := k + 1;
    END LOOP;
    IF k < p_limit THEN
        FOR v IN
            SELECT s.* FROM stepready.steps s
             WHERE s.lease_expires_at < p_as_of AND s.state NOT IN ('enqueued', 'in_progress')
             ORDER BY s.lease_expires_at -- read from steps_orphan_lease_idx, never the whole table
             LIMIT p_limit - k
               FOR UPDATE SKIP LOCKED
        LOOP
            PERFORM stepready._log(v, 'lease.expired', v.state, NULL,
                jsonb_build_object('lease_owner', v.lease_owner, 'lease_expires_at', v.lease_expires_at,
                                   'orphaned', true), p_as_of);
            PERFORM stepready._end_orphans(ARRAY[v.id], ARRAY[v.fence_token]);
            k := k + 1;
        END LOOP;
    END IF;
    RETURN k;
END;
$$;
