-- Map steps (SPEC §19): fan-out when the claim picks a map step, and the aggregate written once when its last
-- element completes. docs/design-core.md ("Map steps") gives the design; elements are rows of stepready.steps
-- (schema version 15), claimed, leased, fenced, retried and reaped like any step.

-- A map step's definition limits: max_elements defaults to 10,000 and is at most 100,000.
CREATE OR REPLACE FUNCTION stepready._map_max_elements(p_map jsonb)
RETURNS int
LANGUAGE sql IMMUTABLE
AS $fn$
    SELECT LEAST(COALESCE(CASE WHEN jsonb_typeof(p_map -> 'max_elements') = 'number'
                               THEN (p_map ->> 'max_elements')::numeric END, 10000), 100000)::int;
$fn$;

-- What is wrong with a step's `map` ({over, max_in_flight, max_elements}), as the end of a message (`: …`), or
-- NULL. p_parents: the step's direct parents (a ${deps.NAME} in over must name one).
CREATE OR REPLACE FUNCTION stepready._map_problem(p_map jsonb, p_parents text[])
RETURNS text
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    v_problem text;
BEGIN
    IF jsonb_typeof(p_map) IS DISTINCT FROM 'object' THEN
        RETURN ': must be an object {over, max_in_flight, max_elements}';
    END IF;
    v_problem := stepready._unknown_keys_problem(p_map, ARRAY['over', 'max_in_flight', 'max_elements']);
    IF v_problem IS NOT NULL THEN
        RETURN ': ' || v_problem;
    END IF;
    IF NOT p_map ? 'over' THEN
        RETURN '.over: is required';
    END IF;
    IF jsonb_typeof(p_map -> 'over') = 'string' THEN
        IF (SELECT count(*) FROM stepready._ref_parse(p_map ->> 'over') p WHERE p.lit IS NULL) <> 1
           OR EXISTS (SELECT 1 FROM stepready._ref_parse(p_map ->> 'over') p WHERE p.lit IS NOT NULL AND p.lit <> '') THEN
            RETURN format('.over: must be an array or exactly one reference ${deps.NAME.PATH} or ${context.PATH}, got %s',
                          p_map -> 'over');
        END IF;
        SELECT CASE WHEN r.problem IS NOT NULL THEN r.problem
                    WHEN r.path[1] NOT IN ('deps', 'context')
                        THEN format('reference %s: over reads deps or context', r.ref)
                    WHEN r.path[1] = 'deps' AND NOT r.path[2] = ANY (COALESCE(p_parents, '{}'))
                        THEN format('reference %s names step "%s", which is not a direct parent (depends_on)',
                                    r.ref, r.path[2]) END
          INTO v_problem
          FROM stepready._input_refs(p_map -> 'over') r LIMIT 1;
        IF v_problem IS NOT NULL THEN
            RETURN '.over: ' || v_problem;
        END IF;
    ELSIF jsonb_typeof(p_map -> 'over') <> 'array' THEN
        RETURN format('.over: must be an array or one reference, got %s', p_map -> 'over');
    END IF;
    v_problem := stepready._integer_problem(p_map -> 'max_in_flight', 1, 2147483647);
    IF v_problem IS NOT NULL THEN
        RETURN '.max_in_flight: ' || v_problem;
    END IF;
    v_problem := stepready._integer_problem(p_map -> 'max_elements', 0, 100000);
    IF v_problem IS NOT NULL THEN
        RETURN '.max_elements: ' || v_problem;
    END IF;
    IF jsonb_typeof(p_map -> 'over') = 'array' AND jsonb_array_length(p_map -> 'over') > stepready._map_max_elements(p_map) THEN
        RETURN format('.over: has %s elements, more than max_elements (%s)', jsonb_array_length(p_map -> 'over'),
                      stepready._map_max_elements(p_map));
    END IF;
    RETURN NULL;
END;
$fn$;

-- Fans out the map steps among p_ids (rows the claim picked and locked; the others are left alone) at p_as_of.
-- Each starts its attempt (in_progress, attempts + 1, fencing token + 1, no lease: no worker runs it, so the
-- reaper never touches it) and reads `over` once, resolved against its deps and its task's context:
--   - not resolvable, not an array, or longer than max_elements: failed `deterministic` (fail_steps, so its
--     retry policy and on_exhausted apply) naming the reference and the length;
--   - an empty array: completed at once with output [];
--   - a flow-control key holding ${element…} or ${index} (SPEC §19) that does not resolve for some element (a
--     path missing or not a scalar there, a key over the bounds of sql/015_bounds.sql): failed `deterministic`,
--     code map_key, naming the key, the element and the placeholder, before any element is written;
--   - otherwise one INSERT writes every element (named NAME[i], from 0), complete rows copying the map step's
--     handler, input (references kept: resolved when each element starts), policy, flow keys (each element's
--     ${element…} and ${index} substituted: _flow_element_key), queue, priorities and rules, with map_total set
--     on the map step and map_done = map_failed = 0. An element's on_exhausted is
--     always fail_task: an element that runs out of attempts ends in error, which ends the map, and the map
--     step's own on_exhausted decides what follows (an element is never skipped on its own).
-- Returns the ids it took (the map steps among p_ids), for the claim to leave out of what it hands over.
-- SECURITY DEFINER (migrations/roles/roles.sql) with stepready.validated_write: the element rows are written
-- complete, so the plain-SQL path's insert triggers (materialize, count, notify, reference check) do not run for
-- them (sql/018_validated_write.sql); elements are left out of the task's counters (the map step stands for them).
CREATE OR REPLACE FUNCTION stepready._map_fan_out(p_ids bigint[], p_as_of timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql
SET stepready.validated_write = 'on'
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $fn$
DECLARE
    v_maps   bigint[];
    r        record;
    v_fail_ids    bigint[] := '{}';
    v_fail_tokens int[] := '{}';
    v_fail_errors jsonb[] := '{}';
    v_done_ids    bigint[] := '{}';
    v_done_tokens int[] := '{}';
    v_tasks       bigint[] := '{}';
    v_n      int;
    v_window int;
    v_key_problem text;
    v_ckeys       text[];
    v_rkeys       text[];
BEGIN
    SELECT array_agg(s.id ORDER BY s.id) INTO v_maps
      FROM stepready.steps s
     WHERE s.id = ANY (p_ids) AND s.map IS NOT NULL
       -- claimable now (what a claim picked): a direct call takes nothing a claim could not
       AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held;
    IF v_maps IS NULL THEN
        RETURN '{}';
    END IF;
    IF NOT stepready._validated_write() THEN
        RAISE EXCEPTION 'stepready._map_fan_out must run as the owner of stepready._create_tasks'
            USING ERRCODE = '42501';
    END IF;
    FOR r IN
        WITH started AS (
            UPDATE stepready.steps s
               SET state = 'in_progress',
                   attempts = s.attempts + 1,
                   fence_token = s.fence_token + 1,
                   last_attempted_at = p_as_of,
                   updated_at = now(),
                   lease_owner = NULL,
                   lease_expires_at = NULL
             WHERE s.id = ANY (v_maps)
            RETURNING s.*, (SELECT st.state FROM stepready.steps st WHERE st.id = s.id) AS from_state
        ), logged AS (
            INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                               details, at)
            SELECT c.task_id, c.id, c.attempts, c.iteration, 'attempt.started', c.from_state, 'in_progress',
                   jsonb_build_object('map', true), p_as_of
              FROM started c
             ORDER BY c.id
        )
        SELECT c.id, c.task_id, c.name, c.fence_token, c.map, o.value AS over, o.problem,
               stepready._map_max_elements(c.map) AS max_elements, c.concurrency_key, c.rate_key
          FROM started c
         CROSS JOIN LATERAL stepready._resolve_input(c.map -> 'over', stepready._step_deps(c.id),
                                (SELECT t.context FROM stepready.tasks t WHERE t.id = c.task_id), c.task_id) o
         ORDER BY c.id
    LOOP
        v_key_problem := NULL;
        v_ckeys := NULL;
        v_rkeys := NULL;
        IF r.problem IS NULL AND jsonb_typeof(r.over) = 'array'
           AND (strpos(r.concurrency_key, '${') > 0 OR strpos(r.rate_key, '${') > 0) THEN
            -- Every element's keys (SPEC §19), computed once, in element order, before any element is written: the
            -- first that does not resolve fails the map step (its CHECK constraints would otherwise abort the whole
            -- claim); else the INSERT below reads them by position (a PL/pgSQL array variable is kept expanded, so
            -- each subscript is O(1)).
            SELECT array_agg(ck.value ORDER BY e.o), array_agg(rk.value ORDER BY e.o),
                   (array_agg(COALESCE('concurrency.key: ' || ck.problem, 'rate_limit.key: ' || rk.problem) ORDER BY e.o)
                        FILTER (WHERE ck.problem IS NOT NULL OR rk.problem IS NOT NULL))[1]
              INTO v_ckeys, v_rkeys, v_key_problem
              FROM jsonb_array_elements(r.over) WITH ORDINALITY AS e(v, o)
             -- A key without placeholders is not looked at (a one-time filter: no call per element).
             LEFT JOIN LATERAL (SELECT k.* FROM stepready._flow_element_key(r.concurrency_key, e.v, (e.o - 1)::int) k
                                 WHERE strpos(r.concurrency_key, '${') > 0) ck ON true
             LEFT JOIN LATERAL (SELECT k.* FROM stepready._flow_element_key(r.rate_key, e.v, (e.o - 1)::int) k
                                 WHERE strpos(r.rate_key, '${') > 0) rk ON true;
        END IF;
        IF v_key_problem IS NOT NULL THEN
            v_fail_ids := v_fail_ids || r.id;
            v_fail_tokens := v_fail_tokens || r.fence_token;
            v_fail_errors := v_fail_errors || jsonb_build_object('class', 'deterministic', 'code', 'map_key',
                'message', format('map step "%s": %s', r.name, v_key_problem));
        ELSIF r.problem IS NOT NULL OR jsonb_typeof(r.over) IS DISTINCT FROM 'array'
           OR jsonb_array_length(r.over) > r.max_elements THEN
            v_fail_ids := v_fail_ids || r.id;
            v_fail_tokens := v_fail_tokens || r.fence_token;
            v_fail_errors := v_fail_errors || jsonb_build_object('class', 'deterministic', 'code', 'map_over',
                'message', 'map.over ' || CASE WHEN jsonb_typeof(r.map -> 'over') = 'string' THEN r.map ->> 'over'
                                    ELSE '(an array literal)' END || ': ' || CASE
                    WHEN r.problem IS NOT NULL THEN r.problem
                    WHEN jsonb_typeof(r.over) IS DISTINCT FROM 'array'
                        THEN format('is %s, not an array', COALESCE(jsonb_typeof(r.over), 'missing'))
                    ELSE format('has %s elements, more than max_elements (%s)', jsonb_array_length(r.over),
                                r.max_elements) END);
        ELSIF jsonb_array_length(r.over) = 0 THEN
            v_done_ids := v_done_ids || r.id;
            v_done_tokens := v_done_tokens || r.fence_token;
        ELSE
            -- Read once: r.map holds the array when `over` is a literal, and reading a member of it per element
            -- would read the whole array each time (O(n²) for the fan-out).
            v_window := COALESCE((r.map ->> 'max_in_flight')::int, 2147483647);
            INSERT INTO stepready.steps (
                task_id, name, handler, input, state, attempts, max_attempts, retryable, backoff, base_delay_ms,
                multiplier, max_delay_ms, jitter, retry_policy, timeout_ms, on_exhausted, rules, iteration,
                max_iterations, collect, breaker_limit, priority, queue, pending_parents, task_held, task_priority,
                concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period_ms, map_step_id, element,
                element_index)
            SELECT m.task_id, m.name || '[' || (e.o - 1) || ']', m.handler, m.input, 'pending', 0, m.max_attempts,
                   m.retryable, m.backoff, m.base_delay_ms, m.multiplier, m.max_delay_ms, m.jitter, m.retry_policy,
                   m.timeout_ms, 'fail_task', m.rules, 0, m.max_iterations, m.collect, m.breaker_limit,
                   m.priority, m.queue,
                   -- the window: elements past the first max_in_flight are held out of the claim index
                   CASE WHEN e.o > v_window THEN 1 ELSE 0 END,
                   false, m.task_priority,
                   CASE WHEN strpos(m.concurrency_key, '${') > 0 THEN v_ckeys[e.o] ELSE m.concurrency_key END,
                   m.concurrency_limit,
                   CASE WHEN strpos(m.rate_key, '${') > 0 THEN v_rkeys[e.o] ELSE m.rate_key END,
                   m.rate_limit, m.rate_period_ms, m.id, e.v, (e.o - 1)::int
              FROM stepready.steps m
             CROSS JOIN LATERAL jsonb_array_elements(r.over) WITH ORDINALITY AS e(v, o)
             WHERE m.id = r.id
             ORDER BY e.o;
            GET DIAGNOSTICS v_n = ROW_COUNT;
            -- The map step hands its concurrency key to its elements (copied above): in_progress for the whole
            -- map, it would otherwise hold one slot of the key itself (_holds_slot), and a limit of 1 would let
            -- no element run. It needs the key no more: it never fans out again (reset_task and retry_step_now
            -- act on its elements).
            UPDATE stepready.steps s SET map_total = v_n, map_done = 0, map_failed = 0, updated_at = now(),
                                         concurrency_key = NULL, concurrency_limit = NULL
             WHERE s.id = r.id;
            v_tasks := v_tasks || r.task_id;
        END IF;
    END LOOP;
    IF cardinality(v_done_ids) > 0 THEN
        UPDATE stepready.steps s SET map_total = 0, map_done = 0, map_failed = 0, updated_at = now()
         WHERE s.id = ANY (v_done_ids);
        PERFORM stepready.complete_steps(v_done_ids, v_done_tokens,
                                         array_fill('[]'::jsonb, ARRAY[cardinality(v_done_ids)]), p_as_of);
    END IF;
    IF cardinality(v_fail_ids) > 0 THEN
        PERFORM stepready.fail_steps(v_fail_ids, v_fail_tokens, v_fail_errors, p_as_of,
                                     array_fill(0::float8, ARRAY[cardinality(v_fail_ids)]));
    END IF;
    IF cardinality(v_tasks) > 0 THEN
        PERFORM stepready._notify_ready(v_tasks);
    END IF;
    RETURN v_maps;
END;
$fn$;

-- The aggregate (called by steps_after_update when elements changed state): counts each touched map step's
-- elements that entered or left complete/resolved_manually (map_done) and error (map_failed). The statement whose
-- update makes map_done reach map_total (the map step's row lock serializes concurrent completions, and the
-- RETURNING tells exactly one of them) writes the output, the elements' outputs in element order, read in a
-- statement of its own (a fresh snapshot: every other element's output is committed), and completes the map step.
-- An element that enters error ends the map: the map step fails with the element's class, not retryable, so its
-- on_exhausted applies, and its other elements that are not in flight or terminal are cancelled.
CREATE OR REPLACE FUNCTION stepready._map_after_elements(p_maps bigint[], p_done int[], p_failed int[],
                                                         p_failed_error jsonb[])
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN
        WITH d AS (SELECT x.* FROM unnest(p_maps, p_done, p_failed, p_failed_error) AS x(id, done, failed, err)
                    ORDER BY x.id)
        UPDATE stepready.steps s
           SET map_done = s.map_done + d.done, map_failed = s.map_failed + d.failed, updated_at = now()
          FROM d
         WHERE s.id = d.id AND s.map_total IS NOT NULL
        RETURNING s.id, s.task_id, s.state, s.fence_token, s.map_total, s.map_done, s.map_failed, s.iteration,
                  s.attempts, d.failed AS newly_failed, d.err, (s.map ->> 'max_in_flight')::int AS max_in_flight
    LOOP
        CONTINUE WHEN r.state <> 'in_progress';
        IF r.max_in_flight IS NOT NULL AND r.newly_failed <= 0 AND r.map_done < r.map_total THEN
            PERFORM stepready._map_release(r.id, r.max_in_flight);
        END IF;
        IF r.newly_failed > 0 THEN
            UPDATE stepready.steps s SET state = 'cancelled', pending_parents = 0, updated_at = now()
             WHERE s.map_step_id = r.id AND s.state IN ('pending', 'waiting_for_retry');
            PERFORM stepready.fail_steps(ARRAY[r.id], ARRAY[r.fence_token],
                ARRAY[jsonb_build_object('class', COALESCE(r.err ->> 'class', 'deterministic'),
                                         'code', 'map_element_failed', 'retryable', false,
                                         'message', r.err ->> 'message')],
                now(), ARRAY[0::float8]);
        ELSIF r.map_done = r.map_total THEN
            WITH done AS (
                UPDATE stepready.steps s
                   SET state = 'complete',
                       output = (SELECT COALESCE(jsonb_agg(e.output ORDER BY e.element_index), '[]')
                                   FROM stepready.steps e WHERE e.map_step_id = r.id),
                       updated_at = now(),
                       completed_at = now()
                 WHERE s.id = r.id AND s.state = 'in_progress'
                RETURNING s.id
            )
            INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                               details, at)
            SELECT r.task_id, d.id, r.attempts, r.iteration, 'attempt.succeeded', 'in_progress', 'complete',
                   jsonb_build_object('map_total', r.map_total), now()
              FROM done d;
        END IF;
    END LOOP;
END;
$fn$;

-- The window (max_in_flight): releases as many held elements of map step p_map_id (pending_parents = 1) as there
-- are free slots, in element order. A slot is held by every released element not yet terminal (one in backoff
-- keeps its slot). Callers hold the map step's row lock, which serializes this between concurrent completions;
-- each statement sees the others' committed releases. Both reads go through steps_map_window_idx (schema version
-- 17), which holds only the elements not yet terminal: the count reads at most max_in_flight entries and the
-- release the first held ones, whatever the size of the map and however many of its elements are finished.
-- enable_seqscan off: on a small table the planner would count by reading every step (the plan is cached for
-- the session, and the table grows).
CREATE OR REPLACE FUNCTION stepready._map_release(p_map_id bigint, p_max_in_flight int)
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
BEGIN
    UPDATE stepready.steps s
       SET pending_parents = 0, updated_at = now()
     -- = ANY (ARRAY(…)), not IN (…): the ids found are then read by primary key (an IN is planned as a hash
     -- join over a scan of every step).
     WHERE s.id = ANY (ARRAY(
               SELECT h.id FROM stepready.steps h
                WHERE h.map_step_id = p_map_id AND h.pending_parents = 1
                  AND h.state NOT IN ('complete', 'error', 'skipped', 'cancelled', 'resolved_manually')
                  AND h.state IN ('pending', 'waiting_for_retry')
                ORDER BY h.element_index
                LIMIT GREATEST(COALESCE(p_max_in_flight, 2147483647)
                               - (SELECT count(*) FROM stepready.steps f
                                   WHERE f.map_step_id = p_map_id AND f.pending_parents = 0
                                     AND f.state NOT IN ('complete', 'error', 'skipped', 'cancelled',
                                                         'resolved_manually')), 0)));
END;
$fn$;

-- An operator re-opens map step p_map (retry_step_now on a map step in error; reset_task on one in error, skipped
-- or cancelled) that has fanned out: it goes back to in_progress (not pending, which would fan out again), and
-- its elements in error, cancelled or skipped go back to ready: with p_fresh (reset_task) to their first attempt,
-- else (retry_step_now) one more attempt each, as for a step. They re-enter the window (held, then released in
-- element order). Completed elements keep their outputs. The map step is locked by the caller; its elements are
-- locked here, in ascending id, after it (the lock order's exception for map steps, docs/design-core.md).
CREATE OR REPLACE FUNCTION stepready._map_reopen(p_map stepready.steps, p_fresh bool, p_as_of timestamptz,
                                                 p_event text)
RETURNS stepready.steps
LANGUAGE plpgsql
AS $fn$
DECLARE
    n stepready.steps;
BEGIN
    UPDATE stepready.steps SET state = 'in_progress', next_attempt_at = NULL, completed_at = NULL, updated_at = now()
     WHERE id = p_map.id RETURNING * INTO n;
    PERFORM 1 FROM stepready.steps e
      WHERE e.map_step_id = p_map.id AND e.state IN ('error', 'cancelled', 'skipped') ORDER BY e.id FOR UPDATE;
    WITH reopened AS (
        UPDATE stepready.steps e
           SET state = CASE WHEN p_fresh THEN 'pending' ELSE stepready._ready_state(e.attempts) END,
               attempts = CASE WHEN p_fresh THEN 0 ELSE e.attempts END,
               max_attempts = CASE WHEN NOT p_fresh AND e.state = 'error' THEN e.attempts + 1 ELSE e.max_attempts END,
               retryable = CASE WHEN NOT p_fresh AND e.state = 'error' THEN true ELSE e.retryable END,
               breaker_fingerprint = CASE WHEN p_fresh THEN NULL ELSE e.breaker_fingerprint END,
               breaker_count = CASE WHEN p_fresh THEN 0 ELSE e.breaker_count END,
               next_attempt_at = stepready._orphan_hold(e.lease_expires_at, p_as_of),
               pending_parents = CASE WHEN p_map.map ? 'max_in_flight' THEN 1 ELSE 0 END,
               updated_at = now()
         WHERE e.map_step_id = p_map.id AND e.state IN ('error', 'cancelled', 'skipped')
        RETURNING e.id, e.task_id, e.attempts, e.iteration, e.state,
                  (SELECT o.state FROM stepready.steps o WHERE o.id = e.id) AS from_state
    )
    INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state, details, at)
    SELECT r.task_id, r.id, r.attempts, r.iteration, p_event, r.from_state, r.state,
           stepready._operator_details(jsonb_build_object('map_step_id', p_map.id)), p_as_of
      FROM reopened r ORDER BY r.id;
    IF p_map.map ? 'max_in_flight' THEN
        PERFORM stepready._map_release(p_map.id, (p_map.map ->> 'max_in_flight')::int);
    END IF;
    RETURN n;
END;
$fn$;

-- The progress of the maps running now, for the metrics (the backlog exporter's stepready_map_* gauges): the map
-- steps in progress that have fanned out, their elements, and of those the ones done (complete or resolved by
-- hand) and failed (error), from the map steps' counters (read through steps_maps_idx), and the elements in flight
-- (enqueued or in progress: read through steps_lease_idx, no more rows than the daemons run). Never reads a map's
-- elements one by one.
CREATE OR REPLACE FUNCTION stepready.map_stats()
RETURNS TABLE (maps bigint, elements bigint, done bigint, failed bigint, in_flight bigint)
LANGUAGE sql STABLE
AS $$
    SELECT count(*), COALESCE(sum(m.map_total), 0), COALESCE(sum(m.map_done), 0), COALESCE(sum(m.map_failed), 0),
           (SELECT count(*) FROM stepready.steps e
             WHERE e.state IN ('enqueued', 'in_progress') AND e.map_step_id IS NOT NULL)
      FROM stepready.steps m
     WHERE m.map IS NOT NULL AND m.map_total IS NOT NULL AND m.state = 'in_progress';
$$;
