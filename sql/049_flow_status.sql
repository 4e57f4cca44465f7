-- Flow control seen from outside the claim (SPEC §14): flow_status, what `scheduler flow list`, the console and
-- the backlog exporter show, and the pruning of idle keys' state. The rules are those of 047_flow.sql.

-- How many rows a bounded read counts at most before it caps or estimates: flow_status's waiting steps,
-- queue_stats's claimable steps (150_queue_stats.sql). Both are read on every console page and by the backlog
-- exporter every round; at 1,000,000 ready steps an exact count took 250-500 ms.
CREATE OR REPLACE FUNCTION stepready._read_budget()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 10000;
$$;

-- The steps waiting at p_as_of per fairness key (claimable and due, retry eligible: ready apart from flow control),
-- bounded: one probe of the claim index finds each (task priority, step priority, key) with claimable rows (a
-- loose index scan), then each is counted up to an equal share of _read_budget() (at least 1). A key with more
-- comes back with waiting = the sum of its shares and capped = true: it has more than that waiting. With the
-- count, the largest own limits among the rows read (the limits of a key never claimed). The cost follows the
-- keys and the budget, never the backlog: at most keys + budget + keys rows of the index.
CREATE OR REPLACE FUNCTION stepready._flow_waiting(p_as_of timestamptz)
RETURNS TABLE (key text, waiting int, capped bool, c_limit int, r_limit int, r_period bigint)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
-- Probes and ranges of steps_claim_order_idx only (see _flow_next_rows).
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
-- Bounded reads costed as if they read the claim index: no JIT compilation (60-100 ms), no parallel workers.
SET jit = off
SET max_parallel_workers_per_gather = 0
AS $$
DECLARE
    v_tp   int;
    v_p    int;
    a_tp   int[] := '{}';   -- the (task priority, step priority, key) of the claimable keyed rows
    a_p    int[] := '{}';
    a_key  text[] := '{}';
    v_keys text[];
    v_cap  int;
BEGIN
    SELECT s.task_priority INTO v_tp FROM stepready.steps s
     WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
     ORDER BY s.task_priority DESC LIMIT 1;
    WHILE v_tp IS NOT NULL LOOP
        SELECT s.priority INTO v_p FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND s.task_priority = v_tp
         ORDER BY s.priority DESC LIMIT 1;
        WHILE v_p IS NOT NULL LOOP
            -- The group's keys, one probe each (the first key after the previous one).
            WITH RECURSIVE k(key) AS (
                SELECT (SELECT s.flow_key FROM stepready.steps s
                         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                           AND NOT s.task_held AND s.task_priority = v_tp AND s.priority = v_p AND s.flow_key > ''
                         ORDER BY s.flow_key LIMIT 1)
                UNION ALL
                SELECT (SELECT s.flow_key FROM stepready.steps s
                         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                           AND NOT s.task_held AND s.task_priority = v_tp AND s.priority = v_p
                           AND s.flow_key > k.key
                         ORDER BY s.flow_key LIMIT 1)
                  FROM k WHERE k.key IS NOT NULL)
            SELECT array_agg(k.key) INTO v_keys FROM k WHERE k.key IS NOT NULL;
            IF v_keys IS NOT NULL THEN
                a_key := a_key || v_keys;
                a_tp := a_tp || array_fill(v_tp, ARRAY[cardinality(v_keys)]);
                a_p := a_p || array_fill(v_p, ARRAY[cardinality(v_keys)]);
            END IF;
            SELECT s.priority INTO v_p FROM stepready.steps s
             WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
               AND s.task_priority = v_tp AND s.priority < v_p
             ORDER BY s.priority DESC LIMIT 1;
        END LOOP;
        SELECT s.task_priority INTO v_tp FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND s.task_priority < v_tp
         ORDER BY s.task_priority DESC LIMIT 1;
    END LOOP;
    IF cardinality(a_key) = 0 THEN
        RETURN;
    END IF;
    v_cap := GREATEST(stepready._read_budget() / cardinality(a_key), 1);
    -- Each (group, key) counted up to v_cap + 1 due rows: one range of the claim index.
    RETURN QUERY
    SELECT g.key, sum(LEAST(c.n, v_cap))::int, bool_or(c.n > v_cap), max(c.c_limit), max(c.r_limit),
           max(c.r_period)
      FROM unnest(a_tp, a_p, a_key) AS g(tp, p, key)
     CROSS JOIN LATERAL (
           SELECT count(*)::int AS n,
                  max(x.concurrency_limit) FILTER (WHERE x.concurrency_key = g.key) AS c_limit,
                  max(x.rate_limit) FILTER (WHERE x.rate_key = g.key) AS r_limit,
                  max(x.rate_period_ms) FILTER (WHERE x.rate_key = g.key) AS r_period
             FROM (SELECT s.concurrency_key, s.concurrency_limit, s.rate_key, s.rate_limit, s.rate_period_ms
                     FROM stepready.steps s
                    WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                      AND s.task_priority = g.tp AND s.priority = g.p AND s.flow_key = g.key
                      AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                      AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                    LIMIT v_cap + 1) x) c
     WHERE c.n > 0
     GROUP BY g.key;
END;
$$;

-- Every key known to flow control at p_as_of: keys with an override, keys claimed before (a flow_state row) and
-- keys with steps waiting. Limits: the override, else the steps' own as the key's last claim applied them (for a
-- key never claimed, the largest among its waiting steps read); in_flight: the slots taken (_flow_in_flight_keys);
-- waiting: steps ready apart from flow control whose fairness key it is, counted up to a share of _read_budget()
-- (waiting_capped: more than `waiting` wait, see _flow_waiting); blocked: _flow_refusal of a key with steps
-- waiting (NULL, 'concurrency_limited' or 'rate_limited'). For the CLI, the console and the backlog exporter.
DROP FUNCTION IF EXISTS stepready.flow_status(timestamptz); -- before waiting_capped
CREATE OR REPLACE FUNCTION stepready.flow_status(p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    key               text,
    concurrency_limit int,
    in_flight         int,
    rate_limit        int,
    rate_period_ms    bigint,
    tokens            float8,
    next_token_at     timestamptz,
    waiting           int,
    overridden        bool,
    blocked           text,
    waiting_capped    bool)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH w AS MATERIALIZED (
        SELECT * FROM stepready._flow_waiting(p_as_of)
    ), k AS MATERIALIZED (
        SELECT f.key FROM stepready.flow_state f UNION SELECT l.key FROM stepready.flow_limits l UNION SELECT w.key FROM w
    ), fl AS MATERIALIZED (
        SELECT c.key, c.in_flight FROM stepready._flow_in_flight_keys(ARRAY(SELECT k.key FROM k), p_as_of) c
    ), e AS (
        SELECT k.key, COALESCE(l.concurrency_limit, f.concurrency_limit, w.c_limit) AS c_limit,
               COALESCE(l.rate_limit, f.rate_limit, w.r_limit) AS r_limit,
               COALESCE(l.rate_period_ms, f.rate_period_ms, w.r_period) AS r_period,
               f.rate_tat, l.key IS NOT NULL AS overridden, COALESCE(fl.in_flight, 0) AS in_flight,
               COALESCE(w.waiting, 0) AS waiting, COALESCE(w.capped, false) AS capped
          FROM k
          LEFT JOIN stepready.flow_limits l ON l.key = k.key
          LEFT JOIN stepready.flow_state f ON f.key = k.key
          LEFT JOIN w ON w.key = k.key
          LEFT JOIN fl ON fl.key = k.key
    )
    SELECT e.key, e.c_limit, e.in_flight, e.r_limit, e.r_period,
           CASE WHEN e.r_limit IS NOT NULL THEN stepready._flow_tokens_left(e.rate_tat, e.r_limit, e.r_period, p_as_of) END,
           CASE WHEN e.r_limit IS NOT NULL THEN stepready._flow_next_token(e.rate_tat, e.r_limit, e.r_period, p_as_of) END,
           e.waiting, e.overridden,
           CASE WHEN e.waiting > 0
                THEN stepready._flow_refusal(e.in_flight, e.c_limit, e.rate_tat, e.r_limit, e.r_period, p_as_of) END,
           e.capped
      FROM e
     ORDER BY e.key;
END;
$$;

-- Deletes at most p_limit flow_state rows of keys that are idle at p_as_of, and returns how many (run by the
-- daemon's pruner every round, so that a system keyed per tenant or per customer does not keep a row for every
-- key it ever saw). A key is idle when none of its steps is in flight, its bucket is full again (rate_tat not
-- after p_as_of: a fresh row, which a claim re-creates on demand, has exactly those tokens) and no wake-up is
-- pending. Its operator override, in flow_limits, is kept. Slots are counted by _flow_in_flight.
--
-- Locking: rows are taken with FOR UPDATE SKIP LOCKED, so a key a claim holds is left alone and the prune never
-- waits. A claim that meets a row being deleted finds no row to lock, leaves the key's steps for its next claim
-- (which creates the row again) and notifies. Limits do not depend on the row: steps in flight are counted from
-- the steps themselves.
CREATE OR REPLACE FUNCTION stepready.prune_flow_state(p_as_of timestamptz DEFAULT now(), p_limit int DEFAULT 1000)
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    v_n int;
BEGIN
    IF p_as_of IS NULL THEN
        RAISE EXCEPTION 'prune_flow_state: p_as_of must not be NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM stepready._check_limit(p_limit, 'prune_flow_state: ');
    WITH idle AS (
        SELECT f.key FROM stepready.flow_state f
         WHERE (f.rate_tat IS NULL OR f.rate_tat <= p_as_of)
           AND (f.wake_at IS NULL OR f.wake_at <= p_as_of)
           AND stepready._flow_in_flight(f.key, p_as_of) = 0
         ORDER BY f.key
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM stepready.flow_state f USING idle WHERE f.key = idle.key RETURNING 1
    )
    SELECT count(*)::int INTO v_n FROM gone;
    RETURN v_n;
END;
$$;
