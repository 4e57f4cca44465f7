-- The attempt lifecycle after a claim (SPEC §6): start, heartbeat, complete, continue, release.
-- Every write is fenced on (step, fencing token, state): a late or duplicate call changes nothing and returns
-- false / NULL. The token (steps.fence_token) is incremented by every start and never lowered, so it never
-- repeats for a step, whatever reset_task, retry_step_now, continue_step or the reaper do to `attempts`; the
-- attempt number users see (`attempts`, recorded in events) is returned beside it. A refused call whose token
-- is the step's own ends the attempt's orphaned lease, if it has one (sql/046_leases.sql).

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

-- enqueued → in_progress for a batch of claimed steps: charges each attempt and returns its fencing token
-- (`attempt`: every later call of that attempt carries it), its attempt number (`attempt_number`, 1-based within
-- the iteration: what users, rules and events see) and what the handler needs (iteration, input, the task's
-- context, rules). One row per requested id (in no particular order); attempt is NULL when the step must not run:
-- it is no longer enqueued (cancelled, reaped, started elsewhere) or does not exist, or its task stopped being
-- runnable since the claim (the step then goes back to its ready state, uncharged, with a step.released event).
-- Rows are locked in ascending id.
--
-- How the statements here are written: PL/pgSQL reuses a generic plan, made without knowing the arrays. Rows are
-- looked up by primary key only (a state test beside the id could make the planner prefer the small partial lease
-- index and read every leased row), tasks through a scalar subquery per row, and two sets are never joined to
-- each other (a cached nested loop over two sets is quadratic).
-- Dropped first: its result columns change (attempt_number, then deps, element and element_index).
DROP FUNCTION IF EXISTS stepready.start_steps(bigint[], text, bigint, timestamptz);
CREATE OR REPLACE FUNCTION stepready.start_steps(
    p_step_ids bigint[], p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (step_id bigint, attempt int, iteration int, input jsonb, context jsonb, rules jsonb,
               attempt_number int, deps jsonb, element jsonb, element_index int)
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
-- Every row is looked up by key (steps by id, a step's edges by step_edges_child_idx, tasks by id), whatever the
-- statistics say: a generic plan made while step_edges was empty read deps with a hash join over every step
-- (measured: 0.9 s for a claim of 100 after 20,000 steps).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_start   bigint[];
    v_release bigint[];
    v_failed  bigint[];
    v_n       bigint;
    v_lease   timestamptz := p_as_of + p_lease_ms * interval '1 millisecond';
    v_details jsonb := jsonb_build_object('worker', p_worker, 'lease_expires_at', v_lease);
BEGIN
    PERFORM stepready._check_lease_args(p_worker, p_lease_ms);
    PERFORM stepready._check_step_ids(p_step_ids, 'p_step_ids');
    SELECT array_agg(l.id ORDER BY l.id) FILTER (WHERE l.state = 'enqueued' AND l.runnable),
           array_agg(l.id ORDER BY l.id) FILTER (WHERE l.state = 'enqueued' AND NOT l.runnable)
      INTO v_start, v_release
      FROM (SELECT k.id, k.state,
                   (SELECT NOT (t.paused OR t.status NOT IN ('pending', 'in_progress'))
                      FROM stepready.tasks t WHERE t.id = k.task_id) AS runnable
              FROM (SELECT s.id, s.state, s.task_id FROM stepready.steps s
                     WHERE s.id = ANY (p_step_ids)
                     ORDER BY s.id
                       FOR UPDATE) k) l;

    IF v_release IS NOT NULL THEN
        WITH released AS (
            UPDATE stepready.steps s
               SET state = stepready._ready_state(s.attempts)
             WHERE s.id = ANY (v_release)
            RETURNING s.id, s.task_id, s.attempts, s.iteration, s.state,
                      (SELECT t.paused FROM stepready.tasks t WHERE t.id = s.task_id) AS paused,
                      (SELECT t.status FROM stepready.tasks t WHERE t.id = s.task_id) AS task_status
        )
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT r.task_id, r.id, r.attempts, r.iteration, 'step.released', 'enqueued', r.state,
               jsonb_build_object('reason', CASE WHEN r.paused THEN 'task_paused' ELSE 'task_not_active' END,
                                  'task_status', r.task_status, 'worker', p_worker), p_as_of
          FROM released r
         ORDER BY r.id;
    END IF;

    IF v_start IS NOT NULL THEN
        RETURN QUERY
        WITH started AS (
            UPDATE stepready.steps s
               SET state = 'in_progress',
                   attempts = s.attempts + 1,
                   fence_token = s.fence_token + 1,
                   last_attempted_at = p_as_of,
                   updated_at = now(),
                   lease_owner = p_worker,
                   lease_expires_at = v_lease
             WHERE s.id = ANY (v_start)
            RETURNING s.id, s.task_id, s.attempts, s.fence_token, s.iteration, s.input, s.input_refs, s.rules,
                      s.map_step_id, s.element, s.element_index,
                      s.lease_expires_at, (SELECT t.context FROM stepready.tasks t WHERE t.id = s.task_id) AS context
        ), logged AS (
            INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                               details, at)
            SELECT st.task_id, st.id, st.attempts, st.iteration, 'attempt.started', 'enqueued', 'in_progress',
                   v_details, p_as_of
              FROM started st
             ORDER BY st.id
        )
        -- SPEC §18: deps, and the input with its references resolved (only where it has `${`). An attempt whose
        -- input does not resolve is left out here and failed below.
        SELECT st.id, st.fence_token, st.iteration, COALESCE(r.value, st.input), st.context, st.rules,
               st.attempts, d.deps, st.element, st.element_index
          FROM started st
         -- _step_deps, written out (a SQL function with a FROM clause is not inlined): the child's edges by
         -- step_edges_child_idx, each parent by primary key (a lateral lookup per edge: never a join of two sets).
         CROSS JOIN LATERAL (SELECT COALESCE(jsonb_object_agg(p.name, p.output), '{}') AS deps
                               FROM stepready.step_edges e
                              CROSS JOIN LATERAL (SELECT q.name, q.output FROM stepready.steps q
                                                   WHERE q.id = e.parent_step_id
                                                     AND q.state IN ('complete', 'resolved_manually') OFFSET 0) p
                              -- an element's deps are its map step's (elements have no edges)
                              WHERE e.child_step_id = COALESCE(st.map_step_id, st.id)) d
         -- Resolved only where the input has `${`: the subquery's filter on the outer row skips the call otherwise
         -- (OFFSET 0 keeps the subquery whole, as in claim_and_start_steps: pulled up, the call ran for every row).
         LEFT JOIN LATERAL (SELECT x.value, x.problem FROM stepready._resolve_input(st.input, d.deps, st.context, st.task_id,
                                                                         st.element, st.element_index) x
                            WHERE st.input_refs OFFSET 0) r ON true
         WHERE r.problem IS NULL;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n < cardinality(v_start) THEN
            v_failed := stepready._fail_unresolved(v_start, p_as_of);
        END IF;
    END IF;
    -- EXCEPT hashes (see complete_steps). Failed at start: not to run either.
    RETURN QUERY SELECT f.id, NULL::int, NULL::int, NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::int, NULL::jsonb,
                        NULL::jsonb, NULL::int
                   FROM (SELECT x FROM unnest(p_step_ids) AS x
                         EXCEPT ALL
                         SELECT y FROM unnest(v_start) AS y WHERE v_failed IS NULL OR y <> ALL (v_failed)) AS f(id);
END;
$$;

-- enqueued → in_progress for one step: start_steps of a one-element batch. Returns the attempt's fencing token
-- (equal to its attempt number until the step is reset or repeats), or NULL when the step must not run.
CREATE OR REPLACE FUNCTION stepready.start_step(
    p_step_id bigint, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS int
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_step_id IS NULL THEN
        PERFORM stepready._check_lease_args(p_worker, p_lease_ms);
        RETURN NULL;
    END IF;
    RETURN (SELECT s.attempt FROM stepready.start_steps(ARRAY[p_step_id], p_worker, p_lease_ms, p_as_of) s);
END;
$$;

-- Extends the lease of a running attempt (p_attempt: its fencing token). False when the attempt is no longer the
-- running one; an orphaned lease is neither extended nor ended (the handler may still run: the worker cancels
-- it and reports once it has returned).
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
     WHERE id = p_step_id AND state = 'in_progress' AND fence_token = p_attempt;
    RETURN FOUND;
END;
$$;

-- in_progress → complete for a batch of successful attempts (parallel arrays: step, fencing token, output), each
-- output collected per the step's collect mode, each with the attempt.succeeded and step.completed events. Fenced
-- per entry: an entry whose step is not in_progress with that token (or does not exist) changes nothing but the
-- end of its attempt's orphaned lease (_end_orphans). One row per entry (in no particular order): completed is
-- false for a fenced entry. Rows are locked in ascending id: the
-- sorted entries drive a nested loop over the primary key (the generic plan), so the update takes its row locks in
-- that order without a separate locking pass. A collect error (collect = merge with a non-object output) fails
-- the whole statement. The statements are written for a generic plan, as in start_steps.
CREATE OR REPLACE FUNCTION stepready.complete_steps(
    p_step_ids bigint[], p_attempts int[], p_outputs jsonb[], p_as_of timestamptz DEFAULT now())
RETURNS TABLE (step_id bigint, completed bool)
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ok       bigint[];
    v_fenced   bigint[];
    v_tokens   int[];
    v_max      bigint := stepready._max_output_bytes();
    v_big_id   bigint;
    v_big_size bigint;
BEGIN
    PERFORM stepready._check_step_ids(p_step_ids, 'p_step_ids');
    PERFORM stepready._check_entries(p_step_ids, cardinality(p_attempts), 'p_attempts');
    PERFORM stepready._check_entries(p_step_ids, cardinality(p_outputs), 'p_outputs');
    -- SPEC §18: no output over the cap (settings.max_output_bytes) is written, for any worker. One pass over the
    -- outputs; the first one over it fails the call, naming its step, its size and the limit.
    SELECT x.id, octet_length(x.output::text) INTO v_big_id, v_big_size
      FROM unnest(p_step_ids, p_outputs) AS x(id, output)
     WHERE octet_length(x.output::text) > v_max
     LIMIT 1;
    IF FOUND THEN
        PERFORM stepready._check_output_size(v_big_id, p_outputs[array_position(p_step_ids, v_big_id)]);
    END IF;
    WITH done AS (
        UPDATE stepready.steps s
           SET state = 'complete',
               output = stepready._collect(s.collect, s.output, u.output, s.iteration, s.id),
               completed_at = p_as_of,
               next_attempt_at = NULL,
               updated_at = now(),
               lease_owner = NULL,
               lease_expires_at = NULL
          FROM (SELECT x.id, x.attempt, x.output FROM unnest(p_step_ids, p_attempts, p_outputs) AS x(id, attempt, output)
                 ORDER BY x.id) AS u
         -- IS TRUE keeps the planner off the partial lease index (see start_steps): the lookup is by id.
         WHERE s.id = u.id AND (s.state = 'in_progress' AND s.fence_token = u.attempt) IS TRUE
        RETURNING s.id, s.task_id, s.attempts, s.iteration
    ), logged AS (
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT d.task_id, d.id, d.attempts, d.iteration, e.event, 'in_progress', 'complete', '{}', p_as_of
          FROM done d
         CROSS JOIN (VALUES (1, 'attempt.succeeded'), (2, 'step.completed')) AS e(n, event)
         ORDER BY d.id, e.n
    )
    SELECT array_agg(d.id) INTO v_ok FROM done d;

    -- EXCEPT hashes; `id = ANY (v_ok)` per entry would cost a batch of N entries N² comparisons.
    RETURN QUERY SELECT u.id, true FROM unnest(v_ok) AS u(id);
    IF COALESCE(cardinality(v_ok), 0) < cardinality(p_step_ids) THEN
        -- Fenced entries (never on the hot path): the end of the refused attempts' orphaned leases.
        SELECT array_agg(x.id), array_agg(x.attempt) INTO v_fenced, v_tokens
          FROM unnest(p_step_ids, p_attempts) AS x(id, attempt)
         WHERE x.id IN (SELECT f FROM unnest(p_step_ids) AS f EXCEPT ALL SELECT y FROM unnest(v_ok) AS y);
        PERFORM stepready._end_orphans(v_fenced, v_tokens);
        RETURN QUERY SELECT f, false FROM unnest(v_fenced) AS f;
    END IF;
END;
$$;

-- in_progress → complete for one attempt: complete_steps of a one-element batch. False when fenced out.
CREATE OR REPLACE FUNCTION stepready.complete_step(
    p_step_id bigint, p_attempt int, p_output jsonb, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_step_id IS NULL THEN
        RETURN false;
    END IF;
    RETURN (SELECT c.completed
              FROM stepready.complete_steps(ARRAY[p_step_id], ARRAY[p_attempt], ARRAY[p_output], p_as_of) c);
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
    PERFORM stepready._check_output_size(p_step_id, p_output); -- SPEC §18
    SELECT * INTO v FROM stepready.steps WHERE id = p_step_id FOR UPDATE;
    IF NOT FOUND OR v.state <> 'in_progress' OR v.fence_token IS DISTINCT FROM p_attempt THEN
        IF FOUND THEN
            PERFORM stepready._end_orphans(ARRAY[p_step_id], ARRAY[p_attempt]);
        END IF;
        RETURN false;
    END IF;
    v_output := stepready._collect(v.collect, v.output, p_output, v.iteration, v.id);
    IF v.collect <> 'replace' THEN
        PERFORM stepready._check_output_size(p_step_id, v_output); -- what append or merge has collected so far
    END IF;
    v_next := v.iteration + 1;
    PERFORM stepready._log(v, 'attempt.succeeded', 'in_progress', NULL, '{}', p_as_of);

    IF v_next >= COALESCE(v.max_iterations, 1000) THEN
        UPDATE stepready.steps
           SET state = 'complete', output = v_output, completed_at = p_as_of, next_attempt_at = NULL,
               lease_owner = NULL, lease_expires_at = NULL
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
           breaker_count = 0,
           lease_owner = NULL,
           lease_expires_at = NULL
     WHERE id = v.id
    RETURNING * INTO n;
    PERFORM stepready._log(n, 'iteration.continued', 'in_progress', 'pending',
        jsonb_build_object('delay_ms', v_delay, 'next_attempt_at', n.next_attempt_at,
                           'input_replaced', p_next_input IS NOT NULL), p_as_of);
    RETURN true;
END;
$$;

-- Hands an attempt back uncharged (graceful shutdown): in_progress with this fencing token, or enqueued and never
-- started (p_attempt NULL or equal to the current attempts count, as the claim row gave it: a claim has no token
-- of its own). The step is immediately ready again. A refused call with the step's own token ends the attempt's
-- orphaned lease (_end_orphans).
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
    ELSIF v.state = 'in_progress' AND v.fence_token = p_attempt THEN
        v_attempts := v.attempts - 1;
    ELSIF v.state = 'enqueued' AND (p_attempt IS NULL OR p_attempt = v.attempts) THEN
        v_attempts := v.attempts;
    ELSE
        PERFORM stepready._end_orphans(ARRAY[p_step_id], ARRAY[p_attempt]);
        RETURN false;
    END IF;
    UPDATE stepready.steps
       SET state = stepready._ready_state(v_attempts), attempts = v_attempts, lease_owner = NULL,
           lease_expires_at = NULL
     WHERE id = v.id
    RETURNING * INTO n;
    PERFORM stepready._log(v, 'step.released', v.state, n.state,
        jsonb_build_object('uncharged', true, 'worker', v.lease_owner), p_as_of);
    RETURN true;
END;
$$;
