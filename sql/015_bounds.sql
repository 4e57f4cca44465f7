-- Bounds on the values of a definition that leave the database: what River and the Go runtime accept (issue 25).
-- A value outside them would be accepted here and refused later, at every claim: River refuses a whole
-- InsertManyTx for one bad queue name, a timeout beyond a Go time.Duration wraps to a deadline already past, and a
-- period or delay beyond it overflows the interval arithmetic of the claim and the failure decision (22008) for
-- every step at once. So each bound is checked where the value is written, with a message naming the step and the
-- field: by the definition checks (_validate_definitions: create_task(s), the task_templates trigger), by
-- the steps insert trigger (plain INSERTs), and by CHECK constraints of the same bounds (migration 000010),
-- which hold for every row whatever wrote it. Each rule is one function below; the CHECK constraints spell the same expressions, and
-- TestBoundsAgreeWithTheirConstraints keeps the two in step.
--
-- Each *_problem function returns NULL for an acceptable value (NULL included) and otherwise what is wrong with
-- it, as the end of a message: "<where>: <field>: <problem>".

-- The longest duration a definition may give, in milliseconds: the largest whole number of milliseconds a Go
-- time.Duration (int64 nanoseconds) holds, about 292 years. Every *_ms duration of a definition (timeout_ms,
-- base_delay_ms, max_delay_ms, rate_limit.period_ms) is at most this, in steps, task retry objects, presets and
-- flow_limits; now() plus this is year 2318, so timestamp arithmetic on it never overflows either.
CREATE OR REPLACE FUNCTION stepready._max_duration_ms()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 9223372036854::bigint;
$$;

-- The longest flow control key (concurrency or rate key, after its placeholders are substituted) and handler
-- name, in characters. Keys are primary keys of flow_state and flow_limits and entries of steps_in_flight_key_idx:
-- a B-tree entry holds at most 2704 bytes, and a longer key would be refused by the claim that first puts it in
-- flight, with every other step of that claim. 255 characters are at most 1020 bytes.
CREATE OR REPLACE FUNCTION stepready._max_name_chars()
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 255;
$$;

-- The functions below are PL/pgSQL, not SQL: the definition checks call them from PL/pgSQL once per step, and a
-- SQL function that is not inlined is planned again on every such call (measured: 0.3 ms per step for the queue
-- rule), where PL/pgSQL keeps its expressions' plans for the session.

-- A value shown in a message: at most 80 characters of it.
CREATE OR REPLACE FUNCTION stepready._shown(p_value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF char_length(p_value) <= 80 THEN
        RETURN format('"%s"', p_value);
    END IF;
    RETURN format('"%s…" (%s characters)', left(p_value, 80), char_length(p_value));
END;
$$;

-- A queue name as River accepts it (river's validateQueueName, river v0.51.1 client.go): at most 64 bytes, matching
-- ^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$ — lowercase ASCII letters and digits, in groups joined by one "_", "-" or
-- "|" (the "|" is River's, a literal inside its character class). River refuses a whole InsertManyTx for one
-- job with another name. 'default' is tested first, as in the CHECK constraint steps_queue_is_a_river_queue_name:
-- it is the common value, and a CHECK constraint is evaluated on every update of a step row.
CREATE OR REPLACE FUNCTION stepready._queue_problem(p_queue text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF p_queue IS NULL OR p_queue = 'default'
       OR (octet_length(p_queue) <= 64 AND p_queue ~ '^[a-z0-9]+([_|-]?[a-z0-9]+)*$') THEN
        RETURN NULL;
    ELSIF p_queue = '' THEN
        RETURN 'must be a non-empty string';
    ELSIF octet_length(p_queue) > 64 THEN
        RETURN format('must be a River queue name of at most 64 characters, got %s', stepready._shown(p_queue));
    END IF;
    RETURN format('must be a River queue name: lowercase letters and digits, in groups joined by one "_", "-" '
                  'or "|" (as in "emails", "high-priority"), got %s', stepready._shown(p_queue));
END;
$$;

-- A duration in milliseconds: NULL or between p_min and _max_duration_ms().
CREATE OR REPLACE FUNCTION stepready._duration_problem(p_ms numeric, p_min bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF p_ms < p_min THEN
        RETURN format('must be >= %s, got %s', p_min, p_ms);
    ELSIF p_ms > stepready._max_duration_ms() THEN
        RETURN format('must be at most %s ms (the longest duration a Go time.Duration holds, about 292 years), '
                      'got %s', stepready._max_duration_ms(), p_ms);
    END IF;
    RETURN NULL;
END;
$$;

-- A flow control key (after substitution) or a handler name: NULL or 1 to _max_name_chars() characters.
CREATE OR REPLACE FUNCTION stepready._name_problem(p_name text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF p_name = '' THEN
        RETURN 'must be a non-empty string';
    ELSIF char_length(p_name) > stepready._max_name_chars() THEN
        RETURN format('must be at most %s characters, got %s', stepready._max_name_chars(), stepready._shown(p_name));
    END IF;
    RETURN NULL;
END;
$$;

-- A point in time that Go can read: NULL or finite. pgx cannot scan 'infinity' into a time.Time, and the
-- daemon's wake-up timer reads the earliest next_attempt_at (next_claim_at) on every claim.
CREATE OR REPLACE FUNCTION stepready._instant_problem(p_at timestamptz)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF NOT isfinite(p_at) THEN
        RETURN format('must be a finite time, got %s', p_at);
    END IF;
    RETURN NULL;
END;
$$;

-- Raises the definition error "<p_where>: <p_field>: <p_problem>" when p_problem is not NULL.
CREATE OR REPLACE FUNCTION stepready._bound_check(p_problem text, p_where text, p_field text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_problem IS NOT NULL THEN
        RAISE EXCEPTION '%: %: %', p_where, p_field, p_problem USING ERRCODE = '22023';
    END IF;
END;
$$;
