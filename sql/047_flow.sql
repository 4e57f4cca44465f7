-- Flow control (SPEC §14): concurrency and rate limits per key, and fairness between keys. This file holds the
-- definitions (key placeholders, the step columns), the token bucket, the rules every caller shares (the count of
-- slots taken, the limit rule, why a step is held) and the operator overrides. The claim applies them in
-- 048_flow_claim.sql, flow_status and the pruning of idle keys are in 049_flow_status.sql; docs/design-core.md
-- explains the design and its costs.
--
-- A step names at most one concurrency key and one rate key (materialized columns, placeholders resolved when
-- the step is inserted). Its fairness key, flow_key, is its concurrency key, else its rate key, else '' (the one
-- group of steps without a key).

-- Substitutes the placeholders of a key (PATH: dot-separated, each part a JSON object field or array index):
--   ${context.PATH} and ${input.PATH}, from p_context and p_input (the task's context, the step's input as
--   stored), in every step's key, substituted once when the step is inserted;
--   ${element}, ${element.PATH} and ${index} (SPEC §19), only in a map step's key: with p_index NULL (the map
--   step being inserted, p_map true) they are checked and kept as written, for the fan-out to substitute with
--   each element (p_element, p_index: _map_fan_out). In any other step's key they are a problem.
-- A missing path, a JSON null, a non-scalar value or a malformed or unknown placeholder is a problem, returned
-- instead of the value (which is then NULL); so is a key that ends up empty, and, in a map step's key, a value
-- holding `${` (its elements would read it as a placeholder). A key without placeholders comes back as it is.
-- A substituted value is never read again for placeholders: an element's `${` stays text.
DROP FUNCTION IF EXISTS stepready._flow_substitute(text, jsonb, jsonb); -- before it had no map or element
CREATE OR REPLACE FUNCTION stepready._flow_substitute(p_key text, p_context jsonb, p_input jsonb,
                                                      p_map bool DEFAULT false, p_element jsonb DEFAULT NULL,
                                                      p_index int DEFAULT NULL,
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
        v_path := string_to_array(v_ph, '.');
        IF v_path[1] IN ('element', 'index') AND v_ph ~ '^(element(\.[^.]+)*|index)$' THEN
            IF p_index IS NOT NULL THEN
                -- An element at fan-out.
                v_val := CASE WHEN v_path[1] = 'index' THEN to_jsonb(p_index) ELSE p_element #> v_path[2:] END;
            ELSIF p_map THEN
                -- The map step: kept as written, for its elements.
                v_out := v_out || substr(v_rest, 1, v_pos + v_end - 1);
                v_rest := substr(v_rest, v_pos + v_end);
                CONTINUE;
            ELSE
                problem := format('placeholder "${%s}": only the elements of a map step have ${element} and ${index}',
                                  v_ph);
                RETURN;
            END IF;
        ELSIF v_path[1] = 'index' THEN
            problem := format('placeholder "${%s}": ${index} has no path', v_ph);
            RETURN;
        ELSIF v_ph ~ '^(context|input)\.[^.]+(\.[^.]+)*$' THEN
            v_root := CASE WHEN v_path[1] = 'context' THEN p_context ELSE p_input END;
            v_val := v_root #> v_path[2:];
        ELSE
            problem := format('placeholder "${%s}" must be ${context.PATH} or ${input.PATH} (or, in a map step''s '
                              'key, ${element}, ${element.PATH} or ${index})', v_ph);
            RETURN;
        END IF;
        IF v_val IS NULL OR jsonb_typeof(v_val) = 'null' THEN
            problem := format('placeholder "${%s}": no value at that path', v_ph);
            RETURN;
        END IF;
        IF jsonb_typeof(v_val) IN ('object', 'array') THEN
            problem := format('placeholder "${%s}": must be a string, number or boolean, got %s', v_ph,
                              jsonb_typeof(v_val));
            RETURN;
        END IF;
        IF p_map AND p_index IS NULL AND strpos(v_val #>> '{}', '${') > 0 THEN
            problem := format('placeholder "${%s}": its value %s holds ${, which the elements of the map step would '
                              'read as a placeholder', v_ph, stepready._shown(v_val #>> '{}'));
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

-- A key with its placeholders substituted (_flow_substitute; p_map: the key of a map step, whose ${element…} and
-- ${index} are kept); a problem is a definition error naming p_where.
DROP FUNCTION IF EXISTS stepready._flow_resolve_key(text, jsonb, jsonb, text); -- before it had no p_map
CREATE OR REPLACE FUNCTION stepready._flow_resolve_key(p_key text, p_context jsonb, p_input jsonb, p_where text,
                                                       p_map bool DEFAULT false)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    r record;
BEGIN
    IF p_key IS NULL OR strpos(p_key, '${') = 0 THEN
        RETURN p_key;
    END IF;
    r := stepready._flow_substitute(p_key, p_context, p_input, p_map);
    IF r.problem IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where, r.problem);
    END IF;
    RETURN r.value;
END;
$$;

-- The key of element p_index (value p_element) of a map step whose key, as stored, is p_key: its ${element},
-- ${element.PATH} and ${index} substituted (_flow_substitute), and checked against the bounds every stored key
-- meets (sql/015_bounds.sql: at most _max_name_chars() characters). A problem names the element and the
-- placeholder; _map_fan_out fails the map step with it rather than write any element. A key without `${` comes
-- back as it is, at the cost of one strpos.
CREATE OR REPLACE FUNCTION stepready._flow_element_key(p_key text, p_element jsonb, p_index int,
                                                       OUT value text, OUT problem text)
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    r record;
BEGIN
    IF p_key IS NULL OR strpos(p_key, '${') = 0 THEN
        value := p_key;
        RETURN;
    END IF;
    -- An assignment, not a SELECT: no executor run per element (100,000 of them in one fan-out).
    r := stepready._flow_substitute(p_key, NULL, NULL, true, p_element, p_index);
    problem := COALESCE(r.problem, CASE WHEN char_length(r.value) > stepready._max_name_chars()
                                        THEN stepready._name_problem(r.value) END);
    IF problem IS NOT NULL THEN
        problem := format('element %s: key "%s": %s', p_index, p_key, problem);
    ELSE
        value := r.value;
    END IF;
END;
$$;

-- What is wrong with a definition's `concurrency` ({key, limit}) or `rate_limit` ({key, limit, period_ms})
-- object, as a whole message starting with p_where; with p_context not NULL, its key's placeholders are also
-- checked against the task context and p_input (the step input); p_map: the step is a map step (its key may
-- hold ${element…} and ${index}). NULL when it is fine, absent or JSON null.
DROP FUNCTION IF EXISTS stepready._flow_problem(jsonb, text, text, jsonb, jsonb); -- before it had no p_map
CREATE OR REPLACE FUNCTION stepready._flow_problem(p_value jsonb, p_kind text, p_where text, p_context jsonb,
                                                   p_input jsonb, p_map bool DEFAULT false)
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
            -- else checked as written when it has no placeholder. (A map step's key keeps its ${element…}: each
            -- element's is checked at fan-out, _flow_element_key.)
            CASE WHEN strpos(p_value ->> 'key', '${') = 0
                     THEN p_where || ': key: ' || stepready._name_problem(p_value ->> 'key')
                 WHEN p_context IS NOT NULL
                     THEN p_where || ': key: ' || COALESCE(
                              (stepready._flow_substitute(p_value ->> 'key', p_context, p_input, p_map)).problem,
                              stepready._name_problem(
                                  (stepready._flow_substitute(p_value ->> 'key', p_context, p_input, p_map)).value))
                 END)
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
-- placeholders resolved (a map step's ${element…} and ${index} kept, for its elements), a key always with its
-- limit (and a rate limit with its period).
CREATE OR REPLACE FUNCTION stepready._flow_materialize(INOUT s stepready.steps, p_context jsonb, p_where text)
LANGUAGE plpgsql
AS $$
DECLARE
    v_map bool := false;
BEGIN
    IF s.concurrency_key IS NULL AND s.rate_key IS NULL AND s.concurrency_limit IS NULL AND s.rate_limit IS NULL
       AND s.rate_period_ms IS NULL THEN
        RETURN;
    END IF;
    IF strpos(s.concurrency_key, '${') > 0 OR strpos(s.rate_key, '${') > 0 THEN
        -- Read only for a key with placeholders: the column exists from schema version 15 on.
        v_map := s.map IS NOT NULL;
    END IF;
    s.concurrency_key := stepready._flow_resolve_key(s.concurrency_key, p_context, s.input,
                                                     p_where || ': concurrency.key', v_map);
    s.rate_key := stepready._flow_resolve_key(s.rate_key, p_context, s.input, p_where || ': rate_limit.key', v_map);
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

-- When the next start of a rate key is allowed, if later than p_as_of (NULL: a token is there now): the first
-- microsecond t with t >= tat - tolerance, the instant _flow_tokens allows a start. The tolerance is rounded down,
-- not to the nearest microsecond: with a fractional tolerance (3 per second: 666,666.67 µs) rounding gave an
-- instant 1 µs before _flow_tokens allowed the start, so readiness and the claim disagreed for that microsecond,
-- and a claim that found no token then recorded no wake-up (the token's time was not after p_as_of).
-- One expression without a FROM clause, so that it is inlined where it is used (the claim evaluates it for
-- every step it takes, through _flow_refusal: called as a function it cost 5 µs a step).
CREATE OR REPLACE FUNCTION stepready._flow_next_token(p_tat timestamptz, p_limit int, p_period_ms bigint,
                                                      p_as_of timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$
    -- The period is clamped as in _flow_tokens. GREATEST ignores a NULL tat (a full bucket): NULL then.
    SELECT CASE WHEN p_as_of IS NOT NULL THEN
        NULLIF(GREATEST(p_tat - floor(LEAST(p_period_ms, 9223372036854) * 1000.0
                                      - LEAST(p_period_ms, 9223372036854) * 1000.0 / GREATEST(p_limit, 1))
                                * interval '1 microsecond',
                        p_as_of),
               p_as_of)
    END;
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

-- The one count of slots taken (SPEC §14): for each key of p_keys, the steps holding a slot of it at p_as_of
-- (stepready._holds_slot: in flight, or an orphaned lease not expired); keys without any are left out. Every
-- caller counts through it: the claim (a batch of keys, in a statement of its own after it locked them, so that
-- it sees every claim of those keys committed before the locks were granted), _flow_in_flight (one key: readiness,
-- explain, prune_flow_state) and flow_status (every key).
--
-- A SQL function, inlined into the statement that calls it: `concurrency_key = ANY (p_keys)` is the index
-- condition of steps_in_flight_key_idx (whose predicate _holds_slot implies), one descent per key, so the cost
-- follows the keys asked and their slots, never the table (measured: 1,000 keys among 4,000 steps in flight in
-- 5-6 ms, as the jsonb lookup it replaces; one key in 0.07 ms instead of 1.6 ms).
DROP FUNCTION IF EXISTS stepready._flow_in_flight_keys(jsonb, timestamptz); -- before it returned a jsonb object
CREATE OR REPLACE FUNCTION stepready._flow_in_flight_keys(p_keys text[], p_as_of timestamptz)
RETURNS TABLE (key text, in_flight int)
LANGUAGE sql STABLE
AS $$
    SELECT s.concurrency_key, count(*)::int
      FROM stepready.steps s
     WHERE s.concurrency_key = ANY (p_keys) AND stepready._holds_slot(s.state, s.lease_expires_at, p_as_of)
     GROUP BY s.concurrency_key;
$$;

-- The slots of one key taken at p_as_of (_flow_in_flight_keys). A scalar subquery and no FROM clause, so that the
-- function is inlined where it is called (a SQL function with a FROM clause is planned again on every call).
DROP FUNCTION IF EXISTS stepready._flow_in_flight(text); -- before it took no p_as_of (no orphaned leases)
CREATE OR REPLACE FUNCTION stepready._flow_in_flight(p_key text, p_as_of timestamptz)
RETURNS int
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE((SELECT c.in_flight FROM stepready._flow_in_flight_keys(ARRAY[p_key], p_as_of) c), 0);
$$;

-- The limit rule of SPEC §14, the one every caller applies (the claim for each step it takes, _flow_blocked for
-- readiness, explain, flow_status): why a key refuses one more start at p_as_of, or NULL when it takes one.
-- p_in_flight is what holds its slots (_flow_in_flight_keys, plus what the calling claim took already); the
-- limits are those that apply (an operator override of flow_limits, else the steps' own). A NULL concurrency
-- limit means no concurrency check (the key is not the step's concurrency key), a NULL rate limit no rate check.
-- Concurrency is checked first: a step refused a slot takes no token. A token is there when _flow_next_token says
-- so, which is exactly when _flow_tokens allows a start.
CREATE OR REPLACE FUNCTION stepready._flow_refusal(p_in_flight int, p_concurrency_limit int, p_rate_tat timestamptz,
                                                   p_rate_limit int, p_rate_period_ms bigint, p_as_of timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN p_in_flight >= p_concurrency_limit THEN 'concurrency_limited'
        WHEN p_rate_limit IS NOT NULL
             AND stepready._flow_next_token(p_rate_tat, p_rate_limit, p_rate_period_ms, p_as_of) IS NOT NULL
        THEN 'rate_limited'
    END;
$$;

-- Why flow control holds a step that is otherwise ready at p_as_of, or NULL (_flow_refusal of its concurrency key,
-- then of its rate key, each with its operator override and its state).
CREATE OR REPLACE FUNCTION stepready._flow_blocked(p_concurrency_key text, p_concurrency_limit int,
                                                   p_rate_key text, p_rate_limit int, p_rate_period_ms bigint,
                                                   p_as_of timestamptz)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE(
        CASE WHEN p_concurrency_key IS NOT NULL THEN
            stepready._flow_refusal(stepready._flow_in_flight(p_concurrency_key, p_as_of),
                                    COALESCE((SELECT l.concurrency_limit FROM stepready.flow_limits l
                                               WHERE l.key = p_concurrency_key), p_concurrency_limit),
                                    NULL, NULL, NULL, p_as_of)
        END,
        CASE WHEN p_rate_key IS NOT NULL THEN
            (SELECT stepready._flow_refusal(NULL, NULL, f.rate_tat, COALESCE(l.rate_limit, p_rate_limit),
                                            COALESCE(l.rate_period_ms, p_rate_period_ms), p_as_of)
               FROM (SELECT 1) one
               LEFT JOIN stepready.flow_state f ON f.key = p_rate_key
               LEFT JOIN stepready.flow_limits l ON l.key = p_rate_key)
        END);
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
