-- Claiming ready steps (SPEC §6). Safe across any number of concurrent claimers. The flow control a keyed group
-- gets (SPEC §14) is in 048_flow_claim.sql.

-- Work routing (SPEC §21): a claim may name the queues (p_queues) and handlers (p_handlers) it takes, NULL
-- meaning any. Its routes are the (queue, handler) pairs both filters allow that have claimable rows now, found by
-- probes of steps_claim_route_idx (schema version 13), which holds the claimable rows keyed by (queue, handler)
-- first and then exactly as steps_claim_order_idx: a route's rows are in claim order. A filtered claim reads
-- only its routes' rows: each probe of the unfiltered claim becomes one probe per route, and where rows of
-- several routes compete for the same places (a group's steps in due order, a key's steps) they are merged in
-- claim order before any is locked, so that only the rows taken are locked.
--
-- Every routed statement orders by the route index's whole key, with the due time spelled as that index spells
-- it, GREATEST(next_attempt_at, '-infinity') (the value of the other indexes' COALESCE): no other index can then
-- give that order, so the planner cannot serve a route's range from steps_claimable_idx (due, id) with a filter
-- on queue and handler, which it did, reading every due step of the other routes first
-- (TestClaimRoutingCostFollowsMatchingSteps).
--
-- Returns NULL arrays for an unfiltered claim (both filters NULL: the claim reads steps_claim_order_idx), else
-- the routes in (queue, handler) order, possibly none (an empty filter allows nothing). Cost: the queues given,
-- or one probe per queue with claimable rows; then one probe per (queue, handler) pair given, or one per handler
-- with claimable rows in each queue. A filter with a NULL element is refused (22023), naming the parameter.
CREATE OR REPLACE FUNCTION stepready._claim_routes(p_queues text[], p_handlers text[],
                                                   OUT p_rq text[], OUT p_rh text[])
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Probes of steps_claim_route_idx only, whatever the statistics say.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_queues text[];
BEGIN
    IF p_queues IS NULL AND p_handlers IS NULL THEN
        RETURN;
    END IF;
    IF array_position(p_queues, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'p_queues must not contain NULL (NULL as a whole means any queue)' USING ERRCODE = '22023';
    END IF;
    IF array_position(p_handlers, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'p_handlers must not contain NULL (NULL as a whole means any handler)' USING ERRCODE = '22023';
    END IF;
    p_rq := '{}';
    p_rh := '{}';
    IF p_queues IS NOT NULL THEN
        v_queues := ARRAY(SELECT DISTINCT q FROM unnest(p_queues) AS q ORDER BY q);
    ELSE
        -- Every queue with claimable rows: one probe each (a loose index scan).
        v_queues := ARRAY(
            WITH RECURSIVE q(queue) AS (
                (SELECT s.queue FROM stepready.steps s
                  WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                  ORDER BY s.queue LIMIT 1)
                UNION ALL
                SELECT (SELECT s.queue FROM stepready.steps s
                         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                           AND NOT s.task_held AND s.queue > q.queue
                         ORDER BY s.queue LIMIT 1)
                  FROM q WHERE q.queue IS NOT NULL)
            SELECT q.queue FROM q WHERE q.queue IS NOT NULL);
    END IF;
    IF p_handlers IS NOT NULL THEN
        -- Each (queue, handler) pair allowed: one probe each.
        SELECT COALESCE(array_agg(r.q ORDER BY r.q, r.h), '{}'), COALESCE(array_agg(r.h ORDER BY r.q, r.h), '{}')
          INTO p_rq, p_rh
          FROM (SELECT q.q, h.h FROM unnest(v_queues) AS q(q)
                 CROSS JOIN (SELECT DISTINCT h FROM unnest(p_handlers) AS h) h
                 -- A lateral probe with LIMIT 1, not EXISTS: a semi-join was planned as a hash join over the whole
                 -- index (every claimable row read: 80 ms at 100,000).
                 CROSS JOIN LATERAL (SELECT 1 FROM stepready.steps s
                                      WHERE s.queue = q.q AND s.handler = h.h
                                        AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                        AND NOT s.task_held
                                      ORDER BY s.queue, s.handler, s.task_priority, s.priority, s.flow_key,
                                               GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id
                                      LIMIT 1) e) r;
    ELSE
        -- Every handler with claimable rows in each queue: one probe each.
        SELECT COALESCE(array_agg(r.q ORDER BY r.q, r.h), '{}'), COALESCE(array_agg(r.h ORDER BY r.q, r.h), '{}')
          INTO p_rq, p_rh
          FROM (SELECT q.q, h.h FROM unnest(v_queues) AS q(q)
                 CROSS JOIN LATERAL (
                       WITH RECURSIVE h(h) AS (
                           (SELECT s.handler FROM stepready.steps s
                             WHERE s.queue = q.q AND s.state IN ('pending', 'waiting_for_retry')
                               AND s.pending_parents = 0 AND NOT s.task_held
                             ORDER BY s.queue, s.handler LIMIT 1)
                           UNION ALL
                           SELECT (SELECT s.handler FROM stepready.steps s
                                    WHERE s.queue = q.q AND s.handler > h.h
                                      AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                      AND NOT s.task_held
                                    ORDER BY s.queue, s.handler LIMIT 1)
                             FROM h WHERE h.h IS NOT NULL)
                       SELECT h.h FROM h WHERE h.h IS NOT NULL) h) r;
    END IF;
END;
$$;

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
DROP FUNCTION IF EXISTS stepready._claim_pick_rows(int, timestamptz); -- before routing (p_rq, p_rh)
CREATE OR REPLACE FUNCTION stepready._claim_pick_rows(p_limit int, p_as_of timestamptz, p_rq text[], p_rh text[],
                                                      OUT p_ids bigint[], OUT p_states text[])
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Every statement here is a probe or a range of steps_claim_order_idx (steps_claim_route_idx when routed). When
-- statistics say most claimable rows are keyed, "is there a keyed row in this group?" was planned as a sequential
-- scan that stops at the first match: it read every finished row before it (measured: 9 ms per claim after
-- 20,000 steps had run).
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_routed  bool := p_rq IS NOT NULL;  -- a filtered claim: p_rq/p_rh are its routes (_claim_routes)
    v_tp      int;
    v_p       int;
    v_cursor  text;
    v_start   text;
    v_keyed   bool := false;
    v_locked  bool := false;
    v_more    bool;
BEGIN
    p_ids := '{}';
    p_states := '{}';
    -- Routed, each probe is one probe per route (the ORDER BY leads with the route so that only
    -- steps_claim_route_idx serves it in claim order), and the answer the best of them.
    IF NOT v_routed THEN
        SELECT s.task_priority INTO v_tp
          FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
         ORDER BY s.task_priority DESC
         LIMIT 1;
    ELSE
        SELECT max(x.tp) INTO v_tp
          FROM unnest(p_rq, p_rh) AS r(q, h)
         CROSS JOIN LATERAL (
               SELECT s.task_priority AS tp FROM stepready.steps s
                WHERE s.queue = r.q AND s.handler = r.h
                  AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                ORDER BY s.queue DESC, s.handler DESC, s.task_priority DESC, s.priority DESC, s.flow_key DESC,
                         GREATEST(s.next_attempt_at, '-infinity'::timestamptz) DESC, s.id DESC
                LIMIT 1) x;
    END IF;
    WHILE v_tp IS NOT NULL LOOP
        IF NOT v_routed THEN
            SELECT s.priority INTO v_p
              FROM stepready.steps s
             WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
               AND s.task_priority = v_tp
             ORDER BY s.priority DESC
             LIMIT 1;
        ELSE
            SELECT max(x.p) INTO v_p
              FROM unnest(p_rq, p_rh) AS r(q, h)
             CROSS JOIN LATERAL (
                   SELECT s.priority AS p FROM stepready.steps s
                    WHERE s.queue = r.q AND s.handler = r.h AND s.task_priority = v_tp
                      AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                    ORDER BY s.queue DESC, s.handler DESC, s.task_priority DESC, s.priority DESC, s.flow_key DESC,
                             GREATEST(s.next_attempt_at, '-infinity'::timestamptz) DESC, s.id DESC
                    LIMIT 1) x;
        END IF;
        WHILE v_p IS NOT NULL LOOP
            IF NOT v_routed THEN
                v_more := EXISTS (SELECT 1 FROM stepready.steps s
                                   WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                     AND NOT s.task_held AND s.task_priority = v_tp AND s.priority = v_p
                                     AND s.flow_key > '');
            ELSE
                v_more := EXISTS (SELECT 1 FROM unnest(p_rq, p_rh) AS r(q, h)
                                   CROSS JOIN LATERAL (
                                         SELECT 1 FROM stepready.steps s
                                          WHERE s.queue = r.q AND s.handler = r.h AND s.task_priority = v_tp
                                            AND s.priority = v_p AND s.flow_key > ''
                                            AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                            AND NOT s.task_held
                                          ORDER BY s.queue, s.handler, s.task_priority, s.priority, s.flow_key,
                                                   GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id
                                          LIMIT 1) x);
            END IF;
            IF NOT v_more THEN
                -- No keyed row in this group: its steps in due order.
                IF NOT v_routed THEN
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
                    SELECT g.p_ids, g.p_states INTO p_ids, p_states
                      FROM stepready._claim_route_range(v_tp, v_p, p_limit, p_as_of, p_rq, p_rh, p_ids, p_states) g;
                END IF;
            ELSE
                IF NOT v_keyed THEN
                    SELECT c.last_key INTO v_cursor FROM stepready.flow_cursor c WHERE c.id = 1;
                    v_start := v_cursor;
                    v_keyed := true;
                END IF;
                SELECT g.p_ids, g.p_states, g.p_cursor, g.p_locked INTO p_ids, p_states, v_cursor, v_locked
                  FROM stepready._claim_flow_group(v_tp, v_p, p_limit, p_as_of, p_rq, p_rh, p_ids, p_states,
                                                   v_cursor, v_locked) g;
            END IF;
            IF cardinality(p_ids) >= p_limit THEN
                EXIT;
            END IF;
            IF NOT v_routed THEN
                SELECT s.priority INTO v_p
                  FROM stepready.steps s
                 WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                   AND s.task_priority = v_tp AND s.priority < v_p
                 ORDER BY s.priority DESC
                 LIMIT 1;
            ELSE
                SELECT max(x.p) INTO v_p
                  FROM unnest(p_rq, p_rh) AS r(q, h)
                 CROSS JOIN LATERAL (
                       SELECT s.priority AS p FROM stepready.steps s
                        WHERE s.queue = r.q AND s.handler = r.h AND s.task_priority = v_tp AND s.priority < v_p
                          AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                          AND NOT s.task_held
                        ORDER BY s.queue DESC, s.handler DESC, s.task_priority DESC, s.priority DESC, s.flow_key DESC,
                                 GREATEST(s.next_attempt_at, '-infinity'::timestamptz) DESC, s.id DESC
                        LIMIT 1) x;
            END IF;
        END LOOP;
        EXIT WHEN cardinality(p_ids) >= p_limit;
        IF NOT v_routed THEN
            SELECT s.task_priority INTO v_tp
              FROM stepready.steps s
             WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
               AND s.task_priority < v_tp
             ORDER BY s.task_priority DESC
             LIMIT 1;
        ELSE
            SELECT max(x.tp) INTO v_tp
              FROM unnest(p_rq, p_rh) AS r(q, h)
             CROSS JOIN LATERAL (
                   SELECT s.task_priority AS tp FROM stepready.steps s
                    WHERE s.queue = r.q AND s.handler = r.h AND s.task_priority < v_tp
                      AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                    ORDER BY s.queue DESC, s.handler DESC, s.task_priority DESC, s.priority DESC, s.flow_key DESC,
                             GREATEST(s.next_attempt_at, '-infinity'::timestamptz) DESC, s.id DESC
                    LIMIT 1) x;
        END IF;
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

-- One (task priority, step priority) group without keyed rows, for a routed claim (_claim_pick_rows): adds up to
-- p_limit - cardinality(p_ids) of the routes' ready rows, in due order (then id) across the routes, to
-- p_ids/p_states.
--
-- One route: its range of steps_claim_route_idx read in due order and locked as the LIMIT takes it, exactly as an
-- unfiltered claim reads steps_claim_order_idx. Several routes: the first rows of each route (as many as wanted,
-- unlocked) are merged in due order and cut to what is wanted; only those are locked (SKIP LOCKED, the readiness
-- rule checked again on the locked row). When some of them were locked by another claimer or moved on, the
-- next ones are read after the last row merged, until enough are taken or no route has more. A pass reads at most
-- (routes x wanted) index entries and locks at most what it takes.
CREATE OR REPLACE FUNCTION stepready._claim_route_range(p_tp int, p_p int, p_limit int, p_as_of timestamptz,
                                                        p_rq text[], p_rh text[],
                                                        INOUT p_ids bigint[], INOUT p_states text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_want     int;
    v_cand     bigint[];
    v_cand_due timestamptz[];
    v_pos_due  timestamptz := '-infinity';
    v_pos_id   bigint := 0;
BEGIN
    IF cardinality(p_rq) = 1 THEN
        SELECT p_ids || COALESCE(array_agg(k.id ORDER BY k.due, k.id), '{}'),
               p_states || COALESCE(array_agg(k.state ORDER BY k.due, k.id), '{}')
          INTO p_ids, p_states
          FROM (SELECT s.id, s.state, GREATEST(s.next_attempt_at, '-infinity'::timestamptz) AS due
                  FROM stepready.steps s
                 WHERE s.queue = p_rq[1] AND s.handler = p_rh[1]
                   AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                   AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = ''
                   AND GREATEST(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                   AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                 ORDER BY s.queue, s.handler, s.task_priority, s.priority, s.flow_key,
                          GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id
                 LIMIT p_limit - cardinality(p_ids)
                   FOR UPDATE SKIP LOCKED) AS k;
        RETURN;
    END IF;
    LOOP
        v_want := p_limit - cardinality(p_ids);
        EXIT WHEN v_want <= 0;
        -- The next v_want rows in due order across the routes, unlocked.
        SELECT array_agg(m.id ORDER BY m.due, m.id), array_agg(m.due ORDER BY m.due, m.id) INTO v_cand, v_cand_due
          FROM (SELECT x.id, x.due
                  FROM unnest(p_rq, p_rh) AS r(q, h)
                 CROSS JOIN LATERAL (
                       SELECT s.id, GREATEST(s.next_attempt_at, '-infinity'::timestamptz) AS due
                         FROM stepready.steps s
                        WHERE s.queue = r.q AND s.handler = r.h
                          AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                          AND NOT s.task_held
                          AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = ''
                          AND (GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id) > (v_pos_due, v_pos_id)
                          AND GREATEST(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                          AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                        ORDER BY s.queue, s.handler, s.task_priority, s.priority, s.flow_key,
                                 GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id
                        LIMIT v_want) x
                 ORDER BY x.due, x.id
                 LIMIT v_want) m;
        EXIT WHEN v_cand IS NULL;
        -- Those of them still claimable and not locked by another claimer, locked.
        SELECT p_ids || COALESCE(array_agg(k.id ORDER BY k.due, k.id), '{}'),
               p_states || COALESCE(array_agg(k.state ORDER BY k.due, k.id), '{}')
          INTO p_ids, p_states
          FROM (SELECT s.id, s.state, GREATEST(s.next_attempt_at, '-infinity'::timestamptz) AS due
                  FROM stepready.steps s
                 WHERE s.id = ANY (v_cand)
                   AND s.queue = ANY (p_rq) AND s.handler = ANY (p_rh)
                   AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                   AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = ''
                   AND GREATEST(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                   AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                 ORDER BY GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id
                   FOR UPDATE SKIP LOCKED) AS k;
        EXIT WHEN cardinality(v_cand) < v_want; -- no route has more
        v_pos_due := v_cand_due[cardinality(v_cand_due)];
        v_pos_id := v_cand[cardinality(v_cand)];
    END LOOP;
END;
$$;

-- The prologue of both claim functions: checks their arguments, finds the routes of a filtered claim
-- (_claim_routes), picks and locks the rows to claim (_claim_pick_rows; none when p_limit is 0 or no route is
-- left), and gives the lease's end and the details their events record.
DROP FUNCTION IF EXISTS stepready._check_claim_args(int, text, bigint, timestamptz); -- folded in here
DROP FUNCTION IF EXISTS stepready._claim_begin(int, text, bigint, timestamptz); -- before routing
CREATE OR REPLACE FUNCTION stepready._claim_begin(p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz,
                                                  p_queues text[], p_handlers text[],
                                                  OUT p_ids bigint[], OUT p_states text[], OUT p_lease timestamptz,
                                                  OUT p_details jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_maps bigint[];
    v_rq text[];
    v_rh text[];
BEGIN
    PERFORM stepready._check_limit(p_limit, '');
    PERFORM stepready._check_lease_args(p_worker, p_lease_ms);
    IF p_as_of IS NULL THEN
        RAISE EXCEPTION 'p_as_of must not be NULL' USING ERRCODE = '22023';
    END IF;
    -- Durable sleeps and signal timeouts that are due (SPEC §20, sql/059_signals.sql) end first, in the claim's
    -- own transaction: their dependents are claimable by this very claim. One probe of steps_wait_due_idx when
    -- none is due (the first deadline, in the index's order: no other index can serve it).
    IF (SELECT s.wait_until FROM stepready.steps s WHERE s.state = 'waiting' AND s.wait_until IS NOT NULL
         ORDER BY s.wait_until LIMIT 1) <= p_as_of THEN
        PERFORM stepready._fire_due_waits(p_as_of);
    END IF;
    SELECT r.p_rq, r.p_rh INTO v_rq, v_rh FROM stepready._claim_routes(p_queues, p_handlers) r;
    p_ids := '{}';
    p_states := '{}';
    IF p_limit > 0 AND (v_rq IS NULL OR cardinality(v_rq) > 0) THEN
        SELECT k.p_ids, k.p_states INTO p_ids, p_states FROM stepready._claim_pick_rows(p_limit, p_as_of, v_rq, v_rh) k;
        -- Map steps (SPEC §19) are not handed over: they fan out into elements here (sql/058_map.sql), which
        -- later claims take like any ready step. Only a claim that picked one pays for more than the test.
        IF EXISTS (SELECT 1 FROM stepready.steps s WHERE s.id = ANY (p_ids) AND s.map IS NOT NULL) THEN
            v_maps := stepready._map_fan_out(p_ids, p_as_of);
            SELECT COALESCE(array_agg(x.id ORDER BY x.o), '{}'), COALESCE(array_agg(x.st ORDER BY x.o), '{}')
              INTO p_ids, p_states
              FROM unnest(p_ids, p_states) WITH ORDINALITY AS x(id, st, o)
             WHERE x.id <> ALL (v_maps);
        END IF;
    END IF;
    p_lease := p_as_of + p_lease_ms * interval '1 millisecond';
    p_details := jsonb_build_object('worker', p_worker, 'lease_expires_at', p_lease);
END;
$$;

-- Claims up to p_limit ready steps for p_worker: they move to enqueued with a lease of p_lease_ms, each with a
-- step.enqueued event; a pending task of a claimed step becomes in_progress (trigger steps_after_update).
-- Returns the claimed rows in claim order. p_queues and p_handlers (SPEC §21) restrict the claim to steps of those
-- queues and handlers (NULL: any; an empty array: none).
DROP FUNCTION IF EXISTS stepready.claim_ready_steps(int, text, bigint, timestamptz); -- before p_queues, p_handlers
CREATE OR REPLACE FUNCTION stepready.claim_ready_steps(
    p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now(),
    p_queues text[] DEFAULT NULL, p_handlers text[] DEFAULT NULL)
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
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids     bigint[];
    v_states  text[];
    v_lease   timestamptz;
    v_details jsonb;
BEGIN
    SELECT b.p_ids, b.p_states, b.p_lease, b.p_details INTO v_ids, v_states, v_lease, v_details
      FROM stepready._claim_begin(p_limit, p_worker, p_lease_ms, p_as_of, p_queues, p_handlers) b;
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
-- p_queues and p_handlers restrict the claim as for claim_ready_steps.
-- Dropped first: its parameters and result columns change (attempt_number, then deps, element and element_index,
-- then p_queues and p_handlers).
DROP FUNCTION IF EXISTS stepready.claim_and_start_steps(int, text, bigint, timestamptz);
CREATE OR REPLACE FUNCTION stepready.claim_and_start_steps(
    p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now(),
    p_queues text[] DEFAULT NULL, p_handlers text[] DEFAULT NULL)
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
SET jit = off
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
      FROM stepready._claim_begin(p_limit, p_worker, p_lease_ms, p_as_of, p_queues, p_handlers) b;
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
           c.queue, c.iteration, t.context, c.rules, c.attempts, d.deps, c.element, c.element_index
      FROM started c
      JOIN stepready.tasks t ON t.id = c.task_id
     -- _step_deps, written out (a SQL function with a FROM clause is not inlined): the child's edges by
     -- step_edges_child_idx, each parent by primary key (a lateral lookup per edge: never a join of two sets).
     CROSS JOIN LATERAL (SELECT COALESCE(jsonb_object_agg(p.name, p.output), '{}') AS deps
                           FROM stepready.step_edges e
                          CROSS JOIN LATERAL (SELECT q.name, q.output FROM stepready.steps q
                                               WHERE q.id = e.parent_step_id
                                                 AND q.state IN ('complete', 'resolved_manually') OFFSET 0) p
                          -- an element's deps are its map step's (elements have no edges)
                          WHERE e.child_step_id = COALESCE(c.map_step_id, c.id)) d
     -- Resolved only where the input has `${`: the subquery's filter on the outer row skips the call otherwise.
     LEFT JOIN LATERAL (SELECT x.value, x.problem FROM stepready._resolve_input(c.input, d.deps, t.context, c.task_id,
                                                                     c.element, c.element_index) x
                        WHERE c.input_refs) r ON true
     WHERE r.problem IS NULL
     ORDER BY c.ord;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n < cardinality(v_ids) THEN
        PERFORM stepready._fail_unresolved(v_ids, p_as_of);
    END IF;
END;
$$;

-- When the next claimable step becomes due after p_as_of, a rate-limited key gets its next token, or a waiting
-- step's sleep ends or signal wait times out (NULL: none is waiting on a backoff, a token or a timer). Daemons set their
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
                 stepready.next_flow_at(p_as_of), -- a rate key's next token (SPEC §14)
                 -- the next sleep to end or signal wait to time out (SPEC §20): the claim fires it
                 (SELECT s.wait_until FROM stepready.steps s
                   WHERE s.state = 'waiting' AND s.wait_until > p_as_of ORDER BY s.wait_until LIMIT 1));
END;
$$;
