-- Flow control (SPEC §14): concurrency and rate limits per key, and fairness between keys. The claim functions
-- (060_claim.sql) enforce it through _claim_flow_group; this file holds the pieces they and the readiness,
-- explain and operator functions share. docs/design-core.md explains the design and its costs.
--
-- A step names at most one concurrency key and one rate key (materialized columns, placeholders resolved when
-- the step is inserted). Its fairness key, flow_key, is its concurrency key, else its rate key, else '' (the one
-- group of steps without a key).

-- Substitutes the ${context.PATH} and ${input.PATH} placeholders of a key (PATH: dot-separated, each part a JSON
-- object field or array index). A missing path, a non-scalar value or a malformed placeholder is a problem,
-- returned instead of the value (which is then NULL); a key without placeholders comes back as it is.
CREATE OR REPLACE FUNCTION stepready._flow_substitute(p_key text, p_context jsonb, p_input jsonb,
                                                      OUT value text, OUT problem text)
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_out   text := '';
    v_rest  text := p_key;
    v_pos   int;
    v_end   int;
    v_ph    text;
    v_root  jsonb;
    v_val   jsonb;
    v_path  text[];
BEGIN
    IF p_key IS NULL OR strpos(p_key, '${') = 0 THEN
        value := p_key;
        RETURN;
    END IF;
    LOOP
        v_pos := strpos(v_rest, '${');
        EXIT WHEN v_pos = 0;
        v_end := strpos(substr(v_rest, v_pos), '}');
        IF v_end = 0 THEN
            problem := format('unterminated placeholder "%s"', substr(v_rest, v_pos));
            RETURN;
        END IF;
        v_ph := substr(v_rest, v_pos + 2, v_end - 3);
        IF v_ph ~ '^context\.[^.]+(\.[^.]+)*$' THEN
            v_root := p_context;
        ELSIF v_ph ~ '^input\.[^.]+(\.[^.]+)*$' THEN
            v_root := p_input;
        ELSE
            problem := format('placeholder "${%s}" must be ${context.PATH} or ${input.PATH}', v_ph);
            RETURN;
        END IF;
        v_path := (string_to_array(v_ph, '.'))[2:];
        v_val := v_root #> v_path;
        IF v_val IS NULL OR jsonb_typeof(v_val) = 'null' THEN
            problem := format('placeholder "${%s}": no value at that path', v_ph);
            RETURN;
        END IF;
        IF jsonb_typeof(v_val) IN ('object', 'array') THEN
            problem := format('placeholder "${%s}": must be a string, number or boolean, got %s', v_ph,
                              jsonb_typeof(v_val));
            RETURN;
        END IF;
        v_out := v_out || substr(v_rest, 1, v_pos - 1) || (v_val #>> '{}');
        v_rest := substr(v_rest, v_pos + v_end);
    END LOOP;
    v_out := v_out || v_rest;
    IF v_out = '' THEN
        problem := format('key "%s" resolves to an empty string', p_key);
        RETURN;
    END IF;
    value := v_out;
END;
$$;

-- A key with its placeholders substituted (_flow_substitute); a problem is a definition error naming p_where.
CREATE OR REPLACE FUNCTION stepready._flow_resolve_key(p_key text, p_context jsonb, p_input jsonb, p_where text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    r record;
BEGIN
    IF p_key IS NULL OR strpos(p_key, '${') = 0 THEN
        RETURN p_key;
    END IF;
    r := stepready._flow_substitute(p_key, p_context, p_input);
    IF r.problem IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where, r.problem);
    END IF;
    RETURN r.value;
END;
$$;

-- What is wrong with a definition's `concurrency` ({key, limit}) or `rate_limit` ({key, limit, period_ms})
-- object, as a whole message starting with p_where; with p_context not NULL, its key's placeholders are also
-- checked against the task context and p_input (the step input). NULL when it is fine, absent or JSON null.
CREATE OR REPLACE FUNCTION stepready._flow_problem(p_value jsonb, p_kind text, p_where text, p_context jsonb,
                                                   p_input jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN NULL
        WHEN jsonb_typeof(p_value) <> 'object' THEN format('%s: must be an object {key, limit%s}, got %s', p_where,
            CASE WHEN p_kind = 'rate_limit' THEN ', period_ms' ELSE '' END, jsonb_typeof(p_value))
        ELSE COALESCE(
            p_where || ': ' || stepready._unknown_keys_problem(p_value,
                CASE WHEN p_kind = 'rate_limit' THEN ARRAY['key', 'limit', 'period_ms'] ELSE ARRAY['key', 'limit'] END),
            p_where || ': key: ' || stepready._text_problem(p_value -> 'key'),
            CASE WHEN p_value ->> 'key' IS NULL THEN p_where || ': key: is required' END,
            p_where || ': limit: ' || stepready._integer_problem(p_value -> 'limit', 1, 2147483647),
            CASE WHEN p_value ->> 'limit' IS NULL THEN p_where || ': limit: is required' END,
            CASE WHEN p_kind = 'rate_limit' THEN COALESCE(
                p_where || ': period_ms: ' || stepready._duration_ms_problem(p_value -> 'period_ms', 1),
                CASE WHEN p_value ->> 'period_ms' IS NULL THEN p_where || ': period_ms: is required' END) END,
            -- The key as it will be stored (sql/015_bounds.sql): substituted when the context and input are known,
            -- else checked as written when it has no placeholder.
            CASE WHEN strpos(p_value ->> 'key', '${') = 0
                     THEN p_where || ': key: ' || stepready._name_problem(p_value ->> 'key')
                 WHEN p_context IS NOT NULL
                     THEN p_where || ': key: ' || COALESCE(
                              (stepready._flow_substitute(p_value ->> 'key', p_context, p_input)).problem,
                              stepready._name_problem(
                                  (stepready._flow_substitute(p_value ->> 'key', p_context, p_input)).value)) END)
    END;
$$;

-- Checks a definition's `concurrency` or `rate_limit` object (the raising form of _flow_problem).
CREATE OR REPLACE FUNCTION stepready._flow_validate(p_value jsonb, p_kind text, p_where text,
                                                    p_context jsonb, p_input jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text := stepready._flow_problem(p_value, p_kind, p_where, p_context, p_input);
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Checks and completes the flow control columns of a step being inserted (called by _steps_materialize):
-- placeholders resolved, a key always with its limit (and a rate limit with its period).
CREATE OR REPLACE FUNCTION stepready._flow_materialize(INOUT s stepready.steps, p_context jsonb, p_where text)
LANGUAGE plpgsql
AS $$
BEGIN
    IF s.concurrency_key IS NULL AND s.rate_key IS NULL AND s.concurrency_limit IS NULL AND s.rate_limit IS NULL
       AND s.rate_period_ms IS NULL THEN
        RETURN;
    END IF;
    s.concurrency_key := stepready._flow_resolve_key(s.concurrency_key, p_context, s.input,
                                                     p_where || ': concurrency.key');
    s.rate_key := stepready._flow_resolve_key(s.rate_key, p_context, s.input, p_where || ': rate_limit.key');
    IF (s.concurrency_key IS NULL) <> (s.concurrency_limit IS NULL) THEN
        PERFORM stepready._definition_error(p_where, 'concurrency_key and concurrency_limit go together');
    END IF;
    IF s.concurrency_limit < 1 THEN
        PERFORM stepready._definition_error(p_where,
            format('concurrency_limit must be >= 1, got %s', s.concurrency_limit));
    END IF;
    IF (s.rate_key IS NULL) <> (s.rate_limit IS NULL) OR (s.rate_key IS NULL) <> (s.rate_period_ms IS NULL) THEN
        PERFORM stepready._definition_error(p_where, 'rate_key, rate_limit and rate_period_ms go together');
    END IF;
    IF s.rate_limit < 1 THEN
        PERFORM stepready._definition_error(p_where, format('rate_limit must be >= 1, got %s', s.rate_limit));
    END IF;
    IF s.rate_period_ms < 1 THEN
        PERFORM stepready._definition_error(p_where,
            format('rate_period_ms must be >= 1, got %s', s.rate_period_ms));
    END IF;
    -- Bounds of sql/015_bounds.sql: a key is a B-tree entry of flow_state and of steps_in_flight_key_idx, and a
    -- period beyond a Go duration overflows the token bucket's arithmetic at every claim of the key.
    PERFORM stepready._bound_check(stepready._name_problem(s.concurrency_key), p_where, 'concurrency_key');
    PERFORM stepready._bound_check(stepready._name_problem(s.rate_key), p_where, 'rate_key');
    PERFORM stepready._bound_check(stepready._duration_problem(s.rate_period_ms, 1), p_where, 'rate_period_ms');
END;
$$;

-- The token bucket of a rate key, kept as one timestamp (the generic cell rate algorithm): with an emission
-- interval T = period / limit and a tolerance of period - T, a start at time t is allowed when
-- t >= tat - (period - T), and moves tat to greatest(tat, t) + T. That is a bucket of `limit` tokens refilled
-- continuously at `limit` per `period`, with exact arithmetic in microseconds.
--
-- How many starts are allowed at p_as_of (at most p_want), and the tat after taking them.
CREATE OR REPLACE FUNCTION stepready._flow_tokens(p_tat timestamptz, p_limit int, p_period_ms bigint,
                                                  p_as_of timestamptz, p_want int,
                                                  OUT p_allowed int, OUT p_new_tat timestamptz)
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    -- The period and limit are within the bounds the tables hold (sql/015_bounds.sql); they are clamped to them
    -- here as well, so that a row written around the constraints cannot make every claim's arithmetic overflow.
    v_per numeric := LEAST(p_period_ms, 9223372036854) * 1000.0;
    v_t   numeric := v_per / GREATEST(p_limit, 1);          -- emission interval, µs
    v_tol numeric := v_per - v_t;                           -- tolerance, µs
    v_now numeric := extract(epoch FROM p_as_of) * 1000000;
    v_tat numeric := GREATEST(COALESCE(extract(epoch FROM p_tat) * 1000000, v_now), v_now);
BEGIN
    -- Start i (0-based) is allowed when v_tat + i*T - tol <= now.
    IF v_tat - v_tol > v_now THEN
        p_allowed := 0;
        p_new_tat := p_tat;
    ELSE
        p_allowed := LEAST(p_want, floor((v_now + v_tol - v_tat) / v_t)::int + 1);
        p_new_tat := 'epoch'::timestamptz + round(v_tat + p_allowed * v_t) * interval '1 microsecond';
    END IF;
END;
$$;

-- When the next start of a rate key is allowed, if later than p_as_of (NULL: a token is there now).
CREATE OR REPLACE FUNCTION stepready._flow_next_token(p_tat timestamptz, p_limit int, p_period_ms bigint,
                                                      p_as_of timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN n.at > p_as_of THEN n.at END
      FROM (SELECT p_tat - round(p.per - p.per / GREATEST(p_limit, 1)) * interval '1 microsecond' AS at
              FROM (SELECT LEAST(p_period_ms, 9223372036854) * 1000.0 AS per) p) n; -- clamped as in _flow_tokens
$$;

-- Tokens left in a rate key's bucket at p_as_of (fractional: the refill is continuous).
CREATE OR REPLACE FUNCTION stepready._flow_tokens_left(p_tat timestamptz, p_limit int, p_period_ms bigint,
                                                       p_as_of timestamptz)
RETURNS float8
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN p_tat IS NULL OR p_tat <= p_as_of THEN p_limit::float8
                ELSE GREATEST(0, p_limit - extract(epoch FROM p_tat - p_as_of) * 1000 * p_limit
                                           / LEAST(GREATEST(p_period_ms, 1), 9223372036854))
           END;
$$;

-- Steps holding a slot of one concurrency key at p_as_of (stepready._holds_slot: in flight, or an orphaned lease
-- not expired), read through steps_in_flight_key_idx by key. _flow_in_flight_keys counts many keys at once.
DROP FUNCTION IF EXISTS stepready._flow_in_flight(text); -- before it took no p_as_of (no orphaned leases)
CREATE OR REPLACE FUNCTION stepready._flow_in_flight(p_key text, p_as_of timestamptz)
RETURNS int
LANGUAGE sql STABLE
AS $$
    SELECT count(*)::int FROM stepready.steps s
     WHERE s.concurrency_key = p_key AND stepready._holds_slot(s.state, s.lease_expires_at, p_as_of);
$$;

-- Steps holding a slot at p_as_of for each key of p_keys (a jsonb object whose keys are the concurrency keys),
-- as an object key -> count (keys without any left out). The claim's count: at most one pass over the steps
-- holding slots, whatever index the planner takes, each row's key looked up in the object (a binary search).
-- Not `= ANY (array)`: over an array that is not a constant that is a linear search per row (measured: 97 ms
-- for 4,000 steps in flight and a batch of 1,000 keys). The same rule as _flow_in_flight (_holds_slot).
--
-- PL/pgSQL for its cached plan (a SQL function with a FROM clause is planned again on every call), read by the
-- claim in a statement of its own after it locked the keys: the statement's snapshot sees every claim of those
-- keys committed before the locks were granted.
CREATE OR REPLACE FUNCTION stepready._flow_in_flight_keys(p_keys jsonb, p_as_of timestamptz)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
-- The partial index steps_in_flight_key_idx holds exactly the rows that may hold a slot: read it, never the table.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN (SELECT COALESCE(jsonb_object_agg(c.key, c.n), '{}')
              FROM (SELECT s.concurrency_key AS key, count(*) AS n FROM stepready.steps s
                     WHERE s.concurrency_key IS NOT NULL
                       AND stepready._holds_slot(s.state, s.lease_expires_at, p_as_of)
                       AND p_keys ? s.concurrency_key
                     GROUP BY s.concurrency_key) c);
END;
$$;

-- Why flow control holds a step that is otherwise ready at p_as_of, or NULL: 'concurrency_limited' when its
-- concurrency key has its limit of steps holding a slot (_holds_slot), else 'rate_limited' when its rate key has no token. The
-- operator overrides of flow_limits win over the step's own limits. The claim applies the same rule
-- (_claim_flow_group).
CREATE OR REPLACE FUNCTION stepready._flow_blocked(p_concurrency_key text, p_concurrency_limit int,
                                                   p_rate_key text, p_rate_limit int, p_rate_period_ms bigint,
                                                   p_as_of timestamptz)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_concurrency_key IS NOT NULL
             AND stepready._flow_in_flight(p_concurrency_key, p_as_of)
                 >= COALESCE((SELECT l.concurrency_limit FROM stepready.flow_limits l WHERE l.key = p_concurrency_key),
                             p_concurrency_limit)
        THEN 'concurrency_limited'
        WHEN p_rate_key IS NOT NULL
             AND (SELECT stepready._flow_next_token(f.rate_tat, COALESCE(l.rate_limit, p_rate_limit),
                                                    COALESCE(l.rate_period_ms, p_rate_period_ms), p_as_of)
                    FROM (SELECT 1) one
                    LEFT JOIN stepready.flow_state f ON f.key = p_rate_key
                    LEFT JOIN stepready.flow_limits l ON l.key = p_rate_key) IS NOT NULL
        THEN 'rate_limited'
    END;
$$;

-- When daemons must wake for a rate key's next token (the earliest after p_as_of), or NULL. A claim that leaves
-- claimable steps of a rate key behind for want of a token records the token's time; next_claim_at includes it.
CREATE OR REPLACE FUNCTION stepready.next_flow_at(p_as_of timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT min(f.wake_at) FROM stepready.flow_state f WHERE f.wake_at > p_as_of);
END;
$$;

-- The keys of the claimable rows of one (task priority, step priority) group in ring order after p_after (NULL:
-- from the start), at most p_max, '' (steps without a key) first in key order, with the id of each key's first
-- claimable row in claim order (due time, then id) as the probe found it: the claim tries that row first, by
-- its primary key, before it reads the key's range again. Each key is one probe of steps_claim_order_idx (a
-- loose index scan): the cost follows the keys returned, not the rows behind them.
DROP FUNCTION IF EXISTS stepready._flow_next_keys(int, int, text, text, int); -- before it returned the keys only
CREATE OR REPLACE FUNCTION stepready._flow_next_rows(p_tp int, p_p int, p_after text, p_upto text, p_max int,
                                                     OUT p_keys text[], OUT p_ids bigint[])
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
-- Each probe must walk steps_claim_order_idx from the previous key: a plan that reads the claimable rows of
-- another index and sorts them costs O(claimable rows) per key (measured: 600 ms for a claim of 1,000 keys).
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_after text := p_after;
    v_id    bigint;
BEGIN
    p_keys := '{}';
    p_ids := '{}';
    IF v_after IS NULL THEN
        -- From the start of the ring: '' (the steps without a key) sorts first.
        SELECT s.flow_key, s.id INTO v_after, v_id FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key >= ''
         ORDER BY s.flow_key, COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id LIMIT 1;
        IF v_after IS NULL OR v_after > p_upto THEN
            RETURN;
        END IF;
        p_keys := ARRAY[v_after];
        p_ids := ARRAY[v_id];
    END IF;
    IF cardinality(p_keys) >= p_max THEN
        RETURN;
    END IF;
    -- One probe per key: each finds the first row of the smallest key after the previous one.
    SELECT p_keys || COALESCE(array_agg(x.key ORDER BY x.n), '{}'), p_ids || COALESCE(array_agg(x.id ORDER BY x.n), '{}')
      INTO p_keys, p_ids
      FROM (WITH RECURSIVE k(key, id, n) AS (
                SELECT r.flow_key, r.id, 1
                  FROM (SELECT s.flow_key, s.id FROM stepready.steps s
                         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                           AND NOT s.task_held AND s.task_priority = p_tp AND s.priority = p_p
                           AND s.flow_key > v_after
                         ORDER BY s.flow_key, COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id
                         LIMIT 1) r
                UNION ALL
                SELECT r.flow_key, r.id, k.n + 1
                  FROM k
                 CROSS JOIN LATERAL (
                       SELECT s.flow_key, s.id FROM stepready.steps s
                        WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                          AND NOT s.task_held AND s.task_priority = p_tp AND s.priority = p_p
                          AND s.flow_key > k.key
                        ORDER BY s.flow_key, COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id
                        LIMIT 1) r
                 WHERE k.n < p_max - cardinality(p_keys)
                   AND (p_upto IS NULL OR k.key < p_upto))
            SELECT k.key, k.id, k.n FROM k WHERE p_upto IS NULL OR k.key <= p_upto) x;
END;
$$;

-- Operator override of a key's limits (SPEC §14, `scheduler flow set`): each non-NULL argument replaces the
-- stored value, the others are kept. Takes effect at the next claim.
CREATE OR REPLACE FUNCTION stepready.set_flow_limit(p_key text, p_concurrency_limit int DEFAULT NULL,
                                                    p_rate_limit int DEFAULT NULL,
                                                    p_rate_period_ms bigint DEFAULT NULL)
RETURNS stepready.flow_limits
LANGUAGE plpgsql
AS $$
DECLARE
    r stepready.flow_limits;
BEGIN
    IF p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION 'flow key must be a non-empty string' USING ERRCODE = '22023';
    END IF;
    IF p_concurrency_limit IS NULL AND p_rate_limit IS NULL AND p_rate_period_ms IS NULL THEN
        RAISE EXCEPTION 'flow key "%": give a concurrency limit, a rate limit with its period, or both', p_key
            USING ERRCODE = '22023';
    END IF;
    IF p_concurrency_limit < 1 THEN
        RAISE EXCEPTION 'flow key "%": concurrency limit must be >= 1, got %', p_key, p_concurrency_limit
            USING ERRCODE = '22023';
    END IF;
    IF (p_rate_limit IS NULL) <> (p_rate_period_ms IS NULL) THEN
        RAISE EXCEPTION 'flow key "%": a rate limit needs its period and a period its rate limit', p_key
            USING ERRCODE = '22023';
    END IF;
    IF p_rate_limit < 1 OR p_rate_period_ms < 1 THEN
        RAISE EXCEPTION 'flow key "%": rate limit and period must be >= 1, got % per % ms', p_key, p_rate_limit,
            p_rate_period_ms USING ERRCODE = '22023';
    END IF;
    -- The bounds of sql/015_bounds.sql, also CHECK constraints of flow_limits (plain INSERTs).
    PERFORM stepready._bound_check(stepready._name_problem(p_key), 'flow_limits', 'key');
    PERFORM stepready._bound_check(stepready._duration_problem(p_rate_period_ms, 1), format('flow key "%s"', p_key),
                                   'period');
    INSERT INTO stepready.flow_limits AS l (key, concurrency_limit, rate_limit, rate_period_ms)
    VALUES (p_key, p_concurrency_limit, p_rate_limit, p_rate_period_ms)
    ON CONFLICT (key) DO UPDATE
       SET concurrency_limit = COALESCE(EXCLUDED.concurrency_limit, l.concurrency_limit),
           rate_limit        = COALESCE(EXCLUDED.rate_limit, l.rate_limit),
           rate_period_ms    = COALESCE(EXCLUDED.rate_period_ms, l.rate_period_ms),
           updated_at        = now()
    RETURNING * INTO r;
    RETURN r;
END;
$$;

-- Removes a key's override (`scheduler flow set KEY --clear`); the steps' own limits apply again. Returns
-- whether there was one.
CREATE OR REPLACE FUNCTION stepready.clear_flow_limit(p_key text)
RETURNS bool
LANGUAGE sql
AS $$
    WITH d AS (DELETE FROM stepready.flow_limits WHERE key = p_key RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM d);
$$;

-- Every key known to flow control at p_as_of: keys with an override, keys claimed before and keys with steps
-- waiting. Limits: the override, else the steps' own as the key's last claim applied them (for a key never
-- claimed, the largest of its waiting steps'); waiting: claimable steps (apart from flow control) whose fairness
-- key it is; blocked: NULL, 'concurrency_limited' or 'rate_limited'. Reads every
-- claimable keyed row once (the claim index), for the CLI, the console and the leader's gauges.
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
    blocked           text)
LANGUAGE sql STABLE
AS $$
    WITH w AS (
        SELECT s.flow_key AS key, count(*)::int AS waiting,
               max(s.concurrency_limit) FILTER (WHERE s.concurrency_key = s.flow_key) AS c_limit,
               max(s.rate_limit) FILTER (WHERE s.rate_key = s.flow_key) AS r_limit,
               max(s.rate_period_ms) FILTER (WHERE s.rate_key = s.flow_key) AS r_period
          FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND s.flow_key <> ''
           AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
           AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
         GROUP BY s.flow_key
    ), e AS (
        SELECT k.key, COALESCE(l.concurrency_limit, f.concurrency_limit, w.c_limit) AS c_limit,
               COALESCE(l.rate_limit, f.rate_limit, w.r_limit) AS r_limit,
               COALESCE(l.rate_period_ms, f.rate_period_ms, w.r_period) AS r_period,
               f.rate_tat, l.key IS NOT NULL AS overridden,
               stepready._flow_in_flight(k.key, p_as_of) AS in_flight, COALESCE(w.waiting, 0) AS waiting
          FROM (SELECT f.key FROM stepready.flow_state f UNION SELECT l.key FROM stepready.flow_limits l
                UNION SELECT w.key FROM w) k
          LEFT JOIN stepready.flow_limits l ON l.key = k.key
          LEFT JOIN stepready.flow_state f ON f.key = k.key
          LEFT JOIN w ON w.key = k.key
    )
    SELECT e.key, e.c_limit, e.in_flight, e.r_limit, e.r_period,
           CASE WHEN e.r_limit IS NOT NULL THEN stepready._flow_tokens_left(e.rate_tat, e.r_limit, e.r_period, p_as_of) END,
           CASE WHEN e.r_limit IS NOT NULL THEN stepready._flow_next_token(e.rate_tat, e.r_limit, e.r_period, p_as_of) END,
           e.waiting, e.overridden,
           CASE WHEN e.waiting = 0 THEN NULL
                WHEN e.in_flight >= e.c_limit THEN 'concurrency_limited'
                WHEN stepready._flow_next_token(e.rate_tat, e.r_limit, e.r_period, p_as_of) IS NOT NULL
                THEN 'rate_limited' END
      FROM e
     ORDER BY e.key;
$$;

-- Deletes at most p_limit flow_state rows of keys that are idle at p_as_of, and returns how many (run by the
-- daemon's pruner every round, so that a system keyed per tenant or per customer does not keep a row for every
-- key it ever saw). A key is idle when none of its steps is in flight, its bucket is full again (rate_tat not
-- after p_as_of: a fresh row, which a claim re-creates on demand, has exactly those tokens) and no wake-up is
-- pending. Its operator override, in flow_limits, is kept.
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
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'prune_flow_state: p_limit must be >= 0, got %', COALESCE(p_limit::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    WITH idle AS (
        SELECT f.key FROM stepready.flow_state f
         WHERE (f.rate_tat IS NULL OR f.rate_tat <= p_as_of)
           AND (f.wake_at IS NULL OR f.wake_at <= p_as_of)
           AND NOT EXISTS (SELECT 1 FROM stepready.steps s
                            WHERE s.concurrency_key = f.key
                              AND stepready._holds_slot(s.state, s.lease_expires_at, p_as_of))
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
