-- Claiming ready steps (SPEC §6). Safe across any number of concurrent claimers. The flow control a keyed group
-- gets (SPEC §14) is in 048_flow_claim.sql.

-- Picks and locks up to p_limit ready steps, in claim order: task priority desc, step priority desc, then within
-- one (task priority, step priority) group round-robin across fairness keys (SPEC §14: steps without a key form
-- one group), each key's steps by due time (NULL first) and id. Returns their ids in that order, and in p_states
-- the states they had (the rows are locked, so the claim reads no row twice).
--
-- It reads steps_claim_order_idx, which holds only claimable rows (not in flight or terminal, every parent
-- satisfied, task runnable and unpaused) keyed by (task_priority, priority, flow_key, due time, id). Within one
-- group and key the due rows are one range of the index, read in order and only as far as needed; the next
-- group or key is found with one index probe. The cost is that of the rows taken (plus rows locked by other
-- claimers, skipped), one probe per group visited and, where keys are present, one probe per key visited,
-- whatever the size of the table and however many rows wait on a future backoff. A group without keyed rows
-- costs one probe more than before flow control.
--
-- FOR UPDATE SKIP LOCKED locks the real rows as the LIMIT takes them: a row locked by another claimer is skipped,
-- and a row another claimer already moved on fails the re-checked WHERE clause, so concurrent claimers get
-- disjoint sets. The whole readiness rule is checked on the locked row: task_held stands for the task's status and
-- pause (kept in step with the task in the same transaction by triggers), and retry eligibility is tested here.
-- A group with keyed rows is claimed by _claim_flow_group (048_flow_claim.sql): round-robin across its keys, each
-- key's limits checked under the lock of its flow_state row.
DROP FUNCTION IF EXISTS stepready._claim_pick(int, timestamptz); -- before it returned the ids only
CREATE OR REPLACE FUNCTION stepready._claim_pick_rows(p_limit int, p_as_of timestamptz,
                                                      OUT p_ids bigint[], OUT p_states text[])
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
-- Every statement here is a probe or a range of steps_claim_order_idx. When statistics say most claimable rows
-- are keyed, "is there a keyed row in this group?" was planned as a sequential scan that stops at the first
-- match: it read every finished row before it (measured: 9 ms per claim after 20,000 steps had run).
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_tp      int;
    v_p       int;
    v_cursor  text;
    v_start   text;
    v_keyed   bool := false;
    v_locked  bool := false;
BEGIN
    p_ids := '{}';
    p_states := '{}';
    SELECT s.task_priority INTO v_tp
      FROM stepready.steps s
     WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
     ORDER BY s.task_priority DESC
     LIMIT 1;
    WHILE v_tp IS NOT NULL LOOP
        SELECT s.priority INTO v_p
          FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND s.task_priority = v_tp
         ORDER BY s.priority DESC
         LIMIT 1;
        WHILE v_p IS NOT NULL LOOP
            IF NOT EXISTS (SELECT 1 FROM stepready.steps s
                            WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                              AND NOT s.task_held AND s.task_priority = v_tp AND s.priority = v_p
                              AND s.flow_key > '') THEN
                -- No keyed row in this group: its steps in due order.
                SELECT p_ids || array_agg(k.id ORDER BY k.due, k.id), p_states || array_agg(k.state ORDER BY k.due, k.id)
                  INTO p_ids, p_states
                  FROM (SELECT s.id, s.state, COALESCE(s.next_attempt_at, '-infinity'::timestamptz) AS due
                          FROM stepready.steps s
                         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                           AND NOT s.task_held
                           AND s.task_priority = v_tp AND s.priority = v_p AND s.flow_key = ''
                           AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                           AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                         ORDER BY COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id
                         LIMIT p_limit - cardinality(p_ids)
                           FOR UPDATE SKIP LOCKED) AS k;
                p_ids := COALESCE(p_ids, '{}');
                p_states := COALESCE(p_states, '{}');
            ELSE
                IF NOT v_keyed THEN
                    SELECT c.last_key INTO v_cursor FROM stepready.flow_cursor c WHERE c.id = 1;
                    v_start := v_cursor;
                    v_keyed := true;
                END IF;
                SELECT g.p_ids, g.p_states, g.p_cursor, g.p_locked INTO p_ids, p_states, v_cursor, v_locked
                  FROM stepready._claim_flow_group(v_tp, v_p, p_limit, p_as_of, p_ids, p_states, v_cursor,
                                                   v_locked) g;
            END IF;
            IF cardinality(p_ids) >= p_limit THEN
                EXIT;
            END IF;
            SELECT s.priority INTO v_p
              FROM stepready.steps s
             WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
               AND s.task_priority = v_tp AND s.priority < v_p
             ORDER BY s.priority DESC
             LIMIT 1;
        END LOOP;
        EXIT WHEN cardinality(p_ids) >= p_limit;
        SELECT s.task_priority INTO v_tp
          FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND s.task_priority < v_tp
         ORDER BY s.task_priority DESC
         LIMIT 1;
    END LOOP;
    -- The round-robin position moves on for the next claim. A claim that finds the row locked leaves it to the
    -- claim holding it (both started from the same position; one of them moves it).
    IF v_keyed AND v_cursor IS DISTINCT FROM v_start THEN
        PERFORM 1 FROM stepready.flow_cursor c WHERE c.id = 1 FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            UPDATE stepready.flow_cursor SET last_key = v_cursor WHERE id = 1;
        END IF;
    END IF;
END;
$$;

-- The prologue of both claim functions: checks their arguments, picks and locks the rows to claim
-- (_claim_pick_rows; none when p_limit is 0), and gives the lease's end and the details their events record.
DROP FUNCTION IF EXISTS stepready._check_claim_args(int, text, bigint, timestamptz); -- folded in here
CREATE OR REPLACE FUNCTION stepready._claim_begin(p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz,
                                                  OUT p_ids bigint[], OUT p_states text[], OUT p_lease timestamptz,
                                                  OUT p_details jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM stepready._check_limit(p_limit, '');
    PERFORM stepready._check_lease_args(p_worker, p_lease_ms);
    IF p_as_of IS NULL THEN
        RAISE EXCEPTION 'p_as_of must not be NULL' USING ERRCODE = '22023';
    END IF;
    p_ids := '{}';
    p_states := '{}';
    IF p_limit > 0 THEN
        SELECT k.p_ids, k.p_states INTO p_ids, p_states FROM stepready._claim_pick_rows(p_limit, p_as_of) k;
    END IF;
    p_lease := p_as_of + p_lease_ms * interval '1 millisecond';
    p_details := jsonb_build_object('worker', p_worker, 'lease_expires_at', p_lease);
END;
$$;

-- Claims up to p_limit ready steps for p_worker: they move to enqueued with a lease of p_lease_ms, each with a
-- step.enqueued event; a pending task of a claimed step becomes in_progress (trigger steps_after_update).
-- Returns the claimed rows in claim order.
CREATE OR REPLACE FUNCTION stepready.claim_ready_steps(
    p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    step_id    bigint,
    task_id    bigint,
    name       text,
    handler    text,
    input      jsonb,
    attempts   int,
    timeout_ms bigint,
    queue      text)
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ids     bigint[];
    v_states  text[];
    v_lease   timestamptz;
    v_details jsonb;
BEGIN
    SELECT b.p_ids, b.p_states, b.p_lease, b.p_details INTO v_ids, v_states, v_lease, v_details
      FROM stepready._claim_begin(p_limit, p_worker, p_lease_ms, p_as_of) b;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH claimed AS (
        UPDATE stepready.steps s
           SET state = 'enqueued',
               updated_at = now(),
               lease_owner = p_worker,
               lease_expires_at = v_lease
          FROM unnest(v_ids, v_states) WITH ORDINALITY AS p(id, from_state, ord)
         WHERE s.id = p.id
        RETURNING s.*, p.from_state, p.ord
    ), logged AS (
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT c.task_id, c.id, c.attempts, c.iteration, 'step.enqueued', c.from_state, 'enqueued', v_details,
               p_as_of
          FROM claimed c
         ORDER BY c.ord
    )
    SELECT c.id, c.task_id, c.name, c.handler, c.input, c.attempts, c.timeout_ms, c.queue
      FROM claimed c
     ORDER BY c.ord;
END;
$$;

-- Claims and starts in one statement, for a dispatcher that runs what it claims at once (direct dispatch): each
-- step goes from its ready state through enqueued to in_progress with both events (step.enqueued, then
-- attempt.started), exactly as claim_ready_steps followed by start_step would leave it, but with one row update.
-- Returns the started attempts in claim order with what their handlers need: `attempt` is the fencing token
-- (every later call of the attempt carries it), `attempt_number` the attempt's number within its iteration
-- (what users, rules and events see; equal to the token until the step is reset or repeats).
-- Dropped first: its result columns change (attempt_number, then deps, element and element_index).
DROP FUNCTION IF EXISTS stepready.claim_and_start_steps(int, text, bigint, timestamptz);
CREATE OR REPLACE FUNCTION stepready.claim_and_start_steps(
    p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    step_id    bigint,
    task_id    bigint,
    name       text,
    handler    text,
    input      jsonb,
    attempt    int,
    timeout_ms bigint,
    queue      text,
    iteration  int,
    context    jsonb,
    rules      jsonb,
    attempt_number int,
    deps       jsonb,
    element    jsonb,
    element_index int)
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
    v_ids     bigint[];
    v_states  text[];
    v_lease   timestamptz;
    v_details jsonb;
    v_n       bigint;
BEGIN
    SELECT b.p_ids, b.p_states, b.p_lease, b.p_details INTO v_ids, v_states, v_lease, v_details
      FROM stepready._claim_begin(p_limit, p_worker, p_lease_ms, p_as_of) b;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;

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
          FROM unnest(v_ids, v_states) WITH ORDINALITY AS p(id, from_state, ord)
         WHERE s.id = p.id
        RETURNING s.*, p.from_state, p.ord
    ), logged AS (
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT c.task_id, c.id, e.attempt, c.iteration, e.event, e.from_state, e.to_state, v_details, p_as_of
          FROM started c
         CROSS JOIN LATERAL (VALUES (1, 'step.enqueued', c.from_state, 'enqueued', c.attempts - 1),
                                    (2, 'attempt.started', 'enqueued', 'in_progress', c.attempts))
               AS e(n, event, from_state, to_state, attempt)
         ORDER BY c.ord, e.n
    )
    -- SPEC §18: deps, and the input with its references resolved (only where it has `${`). An attempt whose input
    -- does not resolve is not handed out: it is failed below (start_steps does the same).
    SELECT c.id, c.task_id, c.name, c.handler, COALESCE(r.value, c.input), c.fence_token, c.timeout_ms,
           c.queue, c.iteration, t.context, c.rules, c.attempts, d.deps, NULL::jsonb, NULL::int
      FROM started c
      JOIN stepready.tasks t ON t.id = c.task_id
     -- _step_deps, written out (a SQL function with a FROM clause is not inlined): the child's edges by
     -- step_edges_child_idx, each parent by primary key (a lateral lookup per edge: never a join of two sets).
     CROSS JOIN LATERAL (SELECT COALESCE(jsonb_object_agg(p.name, p.output), '{}') AS deps
                           FROM stepready.step_edges e
                          CROSS JOIN LATERAL (SELECT q.name, q.output FROM stepready.steps q
                                               WHERE q.id = e.parent_step_id
                                                 AND q.state IN ('complete', 'resolved_manually') OFFSET 0) p
                          WHERE e.child_step_id = c.id) d
     -- Resolved only where the input has `${`: the subquery's filter on the outer row skips the call otherwise.
     LEFT JOIN LATERAL (SELECT x.value, x.problem FROM stepready._resolve_input(c.input, d.deps, t.context, c.task_id) x
                        WHERE c.input_refs) r ON true
     WHERE r.problem IS NULL
     ORDER BY c.ord;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n < cardinality(v_ids) THEN
        PERFORM stepready._fail_unresolved(v_ids, p_as_of);
    END IF;
END;
$$;

-- When the next claimable step becomes due after p_as_of, or a rate-limited key gets its next token (NULL: none
-- is waiting on a backoff or a token). Daemons set their
-- wake-up timer from it. Reads the claim index only; parents, pause and task status are already folded into it.
-- PL/pgSQL, not SQL: a SQL function whose body has a FROM clause is not inlined, and PostgreSQL 15 plans it
-- again on every call (0.3 to 0.8 ms, measured); the daemon calls it before every claim.
CREATE OR REPLACE FUNCTION stepready.next_claim_at(p_as_of timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN LEAST((SELECT min(COALESCE(s.next_attempt_at, '-infinity'::timestamptz))
                    FROM stepready.steps s
                   WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                     AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) > p_as_of),
                 stepready.next_flow_at(p_as_of)); -- a rate key's next token (SPEC §14)
END;
$$;
