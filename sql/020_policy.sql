-- Policy validation and materialization (SPEC §3): every step row carries its resolved retry policy, so a later
-- edit of a preset affects only steps inserted afterwards and readiness never joins presets.
--
-- Each rule of a definition's fields is written once, as a *_problem function: NULL when the value is acceptable,
-- else what is wrong with it ("must be an integer >= 0, got -1"). The set-based validation of create_tasks
-- (sql/100_definitions.sql) evaluates them for every definition of a call in a few statements, and the raising
-- wrappers (_json_integer, _validate_retry, …) serve the plain-SQL path's triggers with the same messages. The
-- problem functions are LANGUAGE sql with a single expression and no subquery, so the planner inlines them into the
-- statements that use them: no function call per value. A subquery that only an error needs sits in a function of
-- its own, called from an ELSE branch.

-- Raises a definition error: SQLSTATE 22023, message "<where>: <what>".
CREATE OR REPLACE FUNCTION stepready._definition_error(p_where text, p_what text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION '%: %', p_where, p_what USING ERRCODE = '22023';
END;
$$;

-- A JSON integer in [p_min, p_max]; JSON null and absent are fine.
CREATE OR REPLACE FUNCTION stepready._integer_problem(p_value jsonb, p_min numeric,
                                                      p_max numeric DEFAULT 9223372036854775807)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN NULL
        WHEN jsonb_typeof(p_value) <> 'number' THEN format('must be an integer >= %s, got %s', p_min, p_value)
        WHEN p_value::numeric <> trunc(p_value::numeric) OR p_value::numeric < p_min
            THEN format('must be an integer >= %s, got %s', p_min, p_value)
        WHEN p_value::numeric > p_max THEN format('must be an integer <= %s, got %s', p_max, p_value)
    END;
$$;

-- A JSON integer number of milliseconds in [p_min, _max_duration_ms()] (sql/015_bounds.sql: the longest duration
-- a Go time.Duration holds); JSON null and absent are fine. The bound's message comes from _duration_problem,
-- called only for a value beyond it.
CREATE OR REPLACE FUNCTION stepready._duration_ms_problem(p_value jsonb, p_min bigint)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE(stepready._integer_problem(p_value, p_min),
                    CASE WHEN jsonb_typeof(p_value) = 'number' AND p_value::numeric > 9223372036854
                         THEN stepready._duration_problem(p_value::numeric, p_min) END);
$$;

-- A JSON number in [p_min, p_max]; JSON null and absent are fine. Compared as the exact JSON number, so that no
-- value can overflow on the way; a number other than 0 that a float8 cannot hold (it would round to 0: below
-- half the smallest subnormal, 4.9e-324) is out of range too, rather than an error of the cast without a field.
CREATE OR REPLACE FUNCTION stepready._number_problem(p_value jsonb, p_min float8, p_max float8)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN NULL
        WHEN jsonb_typeof(p_value) <> 'number' OR p_value::numeric < p_min::numeric
             OR p_value::numeric > p_max::numeric
             OR (p_value::numeric <> 0 AND abs(p_value::numeric) < 2.4703282292062328e-324)
            THEN format('must be a number between %s and %s, got %s', p_min, p_max, p_value)
    END;
$$;

-- A JSON string, non-empty unless p_allow_empty; JSON null and absent are fine.
CREATE OR REPLACE FUNCTION stepready._text_problem(p_value jsonb, p_allow_empty bool DEFAULT false)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE jsonb_typeof(p_value)
        WHEN 'string' THEN CASE WHEN NOT p_allow_empty AND p_value #>> '{}' = ''
                                THEN format('must be a non-empty string, got %s', p_value) END
        WHEN 'null' THEN NULL
        ELSE CASE WHEN p_value IS NOT NULL THEN format('must be a non-empty string, got %s', p_value) END
    END;
$$;

-- A JSON boolean; JSON null and absent are fine.
CREATE OR REPLACE FUNCTION stepready._bool_problem(p_value jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_value IS NULL OR jsonb_typeof(p_value) IN ('null', 'boolean') THEN NULL
        ELSE format('must be true or false, got %s', p_value)
    END;
$$;

-- The message for the first key of p_object (in key order) that is not in p_allowed. Only ever called for an
-- object that has one (see _unknown_keys_problem): its query would keep the caller from being inlined. (Such
-- helpers are PL/pgSQL: a LANGUAGE sql function that is not inlined is parsed and planned again at every call.)
CREATE OR REPLACE FUNCTION stepready._unknown_key_message(p_object jsonb, p_allowed text[])
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT format('unknown field "%s" (allowed: %s)', min(k), array_to_string(p_allowed, ', '))
              FROM jsonb_object_keys(p_object) AS k
             WHERE k <> ALL (p_allowed));
END;
$$;

-- Keys of the JSON object p_object that are not in p_allowed (the caller has checked that it is an object). The
-- common case, every key allowed, is one expression.
CREATE OR REPLACE FUNCTION stepready._unknown_keys_problem(p_object jsonb, p_allowed text[])
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN p_object - p_allowed = '{}'::jsonb THEN NULL
                ELSE stepready._unknown_key_message(p_object, p_allowed) END;
$$;

-- The raising forms, for the plain-SQL path's triggers and the checks outside definitions (fail_step's retry
-- override): each raises "<p_where>: <problem>" and returns the value.

-- A JSON integer in [p_min, p_max], or NULL for JSON null / absent. Anything else is a definition error.
CREATE OR REPLACE FUNCTION stepready._json_integer(p_value jsonb, p_where text, p_min numeric,
                                                   p_max numeric DEFAULT 9223372036854775807)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text := stepready._integer_problem(p_value, p_min, p_max);
BEGIN
    IF v_problem IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where, v_problem);
    END IF;
    RETURN CASE WHEN jsonb_typeof(p_value) = 'number' THEN p_value::numeric::bigint END;
END;
$$;

-- A JSON integer number of milliseconds in [p_min, _max_duration_ms()] (sql/015_bounds.sql), or NULL for JSON
-- null / absent (the raising form of _duration_ms_problem). Anything else is a definition error.
CREATE OR REPLACE FUNCTION stepready._json_duration_ms(p_value jsonb, p_where text, p_min bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text := stepready._duration_ms_problem(p_value, p_min);
BEGIN
    IF v_problem IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where, v_problem);
    END IF;
    RETURN CASE WHEN jsonb_typeof(p_value) = 'number' THEN p_value::numeric::bigint END;
END;
$$;

-- A JSON number in [p_min, p_max], or NULL for JSON null / absent.
CREATE OR REPLACE FUNCTION stepready._json_number(p_value jsonb, p_where text, p_min float8, p_max float8)
RETURNS float8
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text := stepready._number_problem(p_value, p_min, p_max);
BEGIN
    IF v_problem IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where, v_problem);
    END IF;
    RETURN CASE WHEN jsonb_typeof(p_value) = 'number' THEN p_value::numeric::float8 END;
END;
$$;

-- A JSON string (NULL for JSON null / absent), non-empty unless p_allow_empty.
CREATE OR REPLACE FUNCTION stepready._json_text(p_value jsonb, p_where text, p_allow_empty bool DEFAULT false)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text := stepready._text_problem(p_value, p_allow_empty);
BEGIN
    IF v_problem IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where, v_problem);
    END IF;
    RETURN p_value #>> '{}';
END;
$$;

-- A JSON boolean, or NULL for JSON null / absent.
CREATE OR REPLACE FUNCTION stepready._json_bool(p_value jsonb, p_where text)
RETURNS bool
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text := stepready._bool_problem(p_value);
BEGIN
    IF v_problem IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where, v_problem);
    END IF;
    RETURN CASE WHEN jsonb_typeof(p_value) = 'boolean' THEN p_value::bool END;
END;
$$;

-- Rejects keys of the JSON object p_object that are not in p_allowed.
CREATE OR REPLACE FUNCTION stepready._reject_unknown_keys(p_object jsonb, p_allowed text[], p_where text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text := stepready._unknown_keys_problem(p_object, p_allowed);
BEGIN
    IF v_problem IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where, v_problem);
    END IF;
END;
$$;

-- Every retry preset as one JSON object {name: {max_attempts, retryable, …}}: what the set-based validation and
-- create_tasks resolve presets from (the table holds a handful of rows; it is read once per call).
CREATE OR REPLACE FUNCTION stepready._presets()
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT COALESCE(jsonb_object_agg(p.name, to_jsonb(p) - 'name'), '{}') FROM stepready.retry_policies p);
END;
$$;

-- The message for a preset name that p_presets does not hold (only called then: it reads the table again to list
-- the known ones).
CREATE OR REPLACE FUNCTION stepready._unknown_preset_message(p_name text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT format('unknown preset "%s" (known: %s)', p_name, string_agg(name, ', ' ORDER BY name))
              FROM stepready.retry_policies);
END;
$$;

-- What is wrong with a retry object ({policy, max_attempts, retryable, backoff, base_delay_ms, multiplier,
-- max_delay_ms, jitter}), as a whole message: p_where (as "steps[0] \"fetch\": retry") with the field appended.
-- Presets are looked up in p_presets (_presets()). NULL when it is fine, JSON null and absent included.
CREATE OR REPLACE FUNCTION stepready._retry_problem(p_retry jsonb, p_where text, p_presets jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_retry IS NULL OR jsonb_typeof(p_retry) = 'null' THEN NULL
        WHEN jsonb_typeof(p_retry) <> 'object' THEN format('%s: must be an object, got %s', p_where, p_retry)
        ELSE COALESCE(
            p_where || ': ' || stepready._unknown_keys_problem(p_retry,
                ARRAY['policy', 'max_attempts', 'retryable', 'backoff', 'base_delay_ms', 'multiplier', 'max_delay_ms',
                      'jitter']),
            p_where || '.policy: ' || stepready._text_problem(p_retry -> 'policy'),
            CASE WHEN p_retry ->> 'policy' IS NOT NULL AND NOT p_presets ? (p_retry ->> 'policy')
                 THEN p_where || '.policy: ' || stepready._unknown_preset_message(p_retry ->> 'policy') END,
            p_where || '.max_attempts: ' || stepready._integer_problem(p_retry -> 'max_attempts', 0, 2147483647),
            p_where || '.retryable: ' || stepready._bool_problem(p_retry -> 'retryable'),
            p_where || '.backoff: ' || stepready._text_problem(p_retry -> 'backoff'),
            CASE WHEN p_retry ->> 'backoff' NOT IN ('none', 'fixed', 'linear', 'exponential')
                 THEN format('%s.backoff: unknown strategy "%s" (known: none, fixed, linear, exponential)', p_where,
                             p_retry ->> 'backoff') END,
            p_where || '.base_delay_ms: ' || stepready._duration_ms_problem(p_retry -> 'base_delay_ms', 0),
            p_where || '.multiplier: ' || stepready._number_problem(p_retry -> 'multiplier', 1, 1e300),
            p_where || '.max_delay_ms: ' || stepready._duration_ms_problem(p_retry -> 'max_delay_ms', 0),
            p_where || '.jitter: ' || stepready._number_problem(p_retry -> 'jitter', 0, 1))
    END;
$$;

-- Validates a retry object and returns it unchanged (the raising form of _retry_problem).
CREATE OR REPLACE FUNCTION stepready._validate_retry(p_retry jsonb, p_where text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text;
BEGIN
    IF p_retry IS NULL OR jsonb_typeof(p_retry) = 'null' THEN
        RETURN NULL;
    END IF;
    v_problem := stepready._retry_problem(p_retry, p_where, stepready._presets());
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem USING ERRCODE = '22023';
    END IF;
    RETURN p_retry;
END;
$$;

CREATE OR REPLACE FUNCTION stepready._tasks_validate_retry()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM stepready._validate_retry(NEW.retry, format('task "%s": retry', NEW.name));
    RETURN NEW;
END;
$$;

-- Not called for a NULL retry (nothing to check), nor for the rows of create_tasks (validated already:
-- sql/018_validated_write.sql).
DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE OR REPLACE TRIGGER tasks_validate_retry
    BEFORE INSERT OR UPDATE OF retry ON stepready.tasks
    FOR EACH ROW WHEN (NEW.retry IS NOT NULL AND NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._tasks_validate_retry()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;

-- Fills defaults and the materialized policy of a new step, and checks every value with a message that names
-- the step. Resolution per field: step column → step preset → task retry field → task retry.policy preset →
-- standard preset (→ the standard values of SPEC §2 should the row be gone).
CREATE OR REPLACE FUNCTION stepready._steps_materialize()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_task  stepready.tasks;
    v_where text;
    sp      stepready.retry_policies; -- the step's preset
    tp      stepready.retry_policies; -- the task's preset
    sd      stepready.retry_policies; -- standard
    tr      jsonb;                    -- the task's retry object
BEGIN
    v_where := format('step "%s" of task %s', NEW.name, NEW.task_id);
    SELECT * INTO v_task FROM stepready.tasks WHERE id = NEW.task_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION '%: task % does not exist', v_where, NEW.task_id USING ERRCODE = '23503';
    END IF;
    IF NEW.name IS NULL OR NEW.name = '' THEN
        RAISE EXCEPTION 'step of task %: name must be a non-empty string', NEW.task_id USING ERRCODE = '22023';
    END IF;
    -- A wait step (SPEC §20, sql/059_signals.sql) has no handler: its handler column reads `wait`.
    IF NEW.wait IS NOT NULL THEN
        IF NEW.handler IS NOT NULL AND NEW.handler <> 'wait' THEN
            PERFORM stepready._definition_error(v_where, 'handler and wait: a step has one or the other, not both');
        END IF;
        IF NEW.rules IS NOT NULL THEN
            PERFORM stepready._definition_error(v_where, 'rules and wait: rules judge a handler''s attempts; a wait step has none');
        END IF;
        IF NEW.map IS NOT NULL THEN
            PERFORM stepready._definition_error(v_where, 'map and wait: a map step runs a handler per element; a wait step has none');
        END IF;
        IF stepready._wait_problem(NEW.wait, NULL) IS NOT NULL THEN
            RAISE EXCEPTION '%: wait%', v_where, stepready._wait_problem(NEW.wait, NULL) USING ERRCODE = '22023';
        END IF;
        NEW.handler := 'wait';
    END IF;
    IF NEW.handler IS NULL OR NEW.handler = '' THEN
        PERFORM stepready._definition_error(v_where, 'handler must be a non-empty string');
    END IF;

    IF NEW.retry_policy IS NOT NULL THEN
        SELECT * INTO sp FROM stepready.retry_policies WHERE name = NEW.retry_policy;
        IF NOT FOUND THEN
            PERFORM stepready._definition_error(v_where || ': retry_policy',
                format('unknown preset "%s"', NEW.retry_policy));
        END IF;
    END IF;
    tr := COALESCE(v_task.retry, '{}');
    IF tr ->> 'policy' IS NOT NULL THEN
        SELECT * INTO tp FROM stepready.retry_policies WHERE name = tr ->> 'policy';
        IF NOT FOUND THEN
            PERFORM stepready._definition_error(format('task %s: retry.policy', NEW.task_id),
                format('unknown preset "%s"', tr ->> 'policy'));
        END IF;
    END IF;
    SELECT * INTO sd FROM stepready.retry_policies WHERE name = 'standard';

    NEW.max_attempts  := COALESCE(NEW.max_attempts, sp.max_attempts, (tr ->> 'max_attempts')::numeric::int,
                                  tp.max_attempts, sd.max_attempts, 3);
    NEW.retryable     := COALESCE(NEW.retryable, sp.retryable, (tr ->> 'retryable')::bool,
                                  tp.retryable, sd.retryable, true);
    NEW.backoff       := COALESCE(NEW.backoff, sp.backoff, tr ->> 'backoff', tp.backoff, sd.backoff,
                                  'exponential');
    NEW.base_delay_ms := COALESCE(NEW.base_delay_ms, sp.base_delay_ms, (tr ->> 'base_delay_ms')::numeric::bigint,
                                  tp.base_delay_ms, sd.base_delay_ms, 1000);
    NEW.multiplier    := COALESCE(NEW.multiplier, sp.multiplier, (tr ->> 'multiplier')::float8,
                                  tp.multiplier, sd.multiplier, 2);
    NEW.max_delay_ms  := COALESCE(NEW.max_delay_ms, sp.max_delay_ms, (tr ->> 'max_delay_ms')::numeric::bigint,
                                  tp.max_delay_ms, sd.max_delay_ms,
                                  CASE WHEN sd.name IS NULL THEN 30000 END);
    NEW.jitter        := COALESCE(NEW.jitter, sp.jitter, (tr ->> 'jitter')::float8, tp.jitter, sd.jitter, 0);
    NEW.retry_policy  := COALESCE(NEW.retry_policy, tr ->> 'policy', 'standard');
    -- A wait step (SPEC §20) has one attempt and no retry, whatever the policies say (create_tasks stores the same).
    IF NEW.wait IS NOT NULL THEN
        NEW.max_attempts := 1;
        NEW.retryable    := false;
    END IF;

    IF NEW.max_attempts < 0 THEN
        PERFORM stepready._definition_error(v_where, format('max_attempts must be >= 0, got %s', NEW.max_attempts));
    END IF;
    IF NEW.backoff NOT IN ('none', 'fixed', 'linear', 'exponential') THEN
        PERFORM stepready._definition_error(v_where,
            format('unknown backoff strategy "%s" (known: none, fixed, linear, exponential)', NEW.backoff));
    END IF;
    IF NEW.base_delay_ms < 0 THEN
        PERFORM stepready._definition_error(v_where, format('base_delay_ms must be >= 0, got %s', NEW.base_delay_ms));
    END IF;
    IF NOT (NEW.multiplier >= 1 AND NEW.multiplier < 'Infinity'::float8) THEN
        PERFORM stepready._definition_error(v_where, format('multiplier must be >= 1, got %s', NEW.multiplier));
    END IF;
    IF NEW.max_delay_ms < 0 THEN
        PERFORM stepready._definition_error(v_where, format('max_delay_ms must be >= 0, got %s', NEW.max_delay_ms));
    END IF;
    IF NOT (NEW.jitter >= 0 AND NEW.jitter <= 1) THEN
        PERFORM stepready._definition_error(v_where, format('jitter must be between 0 and 1, got %s', NEW.jitter));
    END IF;
    IF NEW.timeout_ms IS NOT NULL AND NEW.timeout_ms <= 0 THEN
        PERFORM stepready._definition_error(v_where, format('timeout_ms must be > 0, got %s', NEW.timeout_ms));
    END IF;
    IF NEW.max_iterations IS NOT NULL AND NEW.max_iterations < 1 THEN
        PERFORM stepready._definition_error(v_where,
            format('max_iterations must be >= 1, got %s', NEW.max_iterations));
    END IF;
    IF NEW.breaker_limit < 0 THEN
        PERFORM stepready._definition_error(v_where, format('breaker_limit must be >= 0, got %s', NEW.breaker_limit));
    END IF;
    IF NEW.attempts < 0 THEN
        PERFORM stepready._definition_error(v_where, format('attempts must be >= 0, got %s', NEW.attempts));
    END IF;
    -- What leaves the database for River and the Go runtime stays within what they accept (sql/015_bounds.sql;
    -- the CHECK constraints of migration 000010 hold the same bounds). Each test is inlined so that a step within
    -- bounds, the common case, costs no function call.
    IF char_length(NEW.handler) > 255 THEN
        PERFORM stepready._bound_check(stepready._name_problem(NEW.handler), v_where, 'handler');
    END IF;
    IF NEW.timeout_ms > 9223372036854 OR NEW.base_delay_ms > 9223372036854 OR NEW.max_delay_ms > 9223372036854 THEN
        PERFORM stepready._bound_check(stepready._duration_problem(NEW.timeout_ms, 1), v_where, 'timeout_ms');
        PERFORM stepready._bound_check(stepready._duration_problem(NEW.base_delay_ms, 0), v_where, 'base_delay_ms');
        PERFORM stepready._bound_check(stepready._duration_problem(NEW.max_delay_ms, 0), v_where, 'max_delay_ms');
    END IF;
    IF NOT isfinite(NEW.next_attempt_at) THEN
        PERFORM stepready._bound_check(stepready._instant_problem(NEW.next_attempt_at), v_where, 'next_attempt_at');
    END IF;
    IF NEW.queue <> 'default' THEN
        PERFORM stepready._bound_check(stepready._queue_problem(NEW.queue), v_where, 'queue');
    END IF;

    -- An explicit NULL means "not set": fill the documented defaults.
    NEW.state         := COALESCE(NEW.state, 'pending');
    NEW.input         := COALESCE(NEW.input, '{}');
    NEW.attempts      := COALESCE(NEW.attempts, 0);
    NEW.iteration     := COALESCE(NEW.iteration, 0);
    NEW.on_exhausted  := COALESCE(NEW.on_exhausted, 'fail_task');
    NEW.collect       := COALESCE(NEW.collect, 'replace');
    NEW.breaker_limit := COALESCE(NEW.breaker_limit, 3);
    NEW.priority      := COALESCE(NEW.priority, 0);
    NEW.queue         := COALESCE(NEW.queue, 'default');
    IF NEW.state NOT IN ('pending', 'enqueued', 'in_progress', 'waiting_for_retry', 'waiting', 'complete', 'error',
                         'skipped', 'cancelled', 'resolved_manually') THEN
        PERFORM stepready._definition_error(v_where, format('unknown state "%s"', NEW.state));
    END IF;
    IF NEW.on_exhausted NOT IN ('fail_task', 'skip', 'skip_cascade') THEN
        PERFORM stepready._definition_error(v_where,
            format('on_exhausted must be fail_task, skip or skip_cascade, got "%s"', NEW.on_exhausted));
    END IF;
    IF NEW.collect NOT IN ('append', 'replace', 'merge') THEN
        PERFORM stepready._definition_error(v_where,
            format('collect must be append, replace or merge, got "%s"', NEW.collect));
    END IF;
    IF NEW.rules IS NOT NULL AND jsonb_typeof(NEW.rules) <> 'array' THEN
        PERFORM stepready._definition_error(v_where, 'rules must be a JSON array');
    END IF;

    -- Flow control (SPEC §14, sql/047_flow.sql): placeholders resolved once, here.
    NEW := stepready._flow_materialize(NEW, v_task.context, v_where);

    -- Trigger-maintained columns start from known values whatever the INSERT said.
    NEW.pending_parents     := 0;
    NEW.task_held           := v_task.paused OR v_task.status NOT IN ('pending', 'in_progress');
    NEW.task_priority       := v_task.priority;
    NEW.breaker_fingerprint := NULL;
    NEW.breaker_count       := 0;
    -- The fencing token is never below the attempt count (a row inserted in flight is fenced by its attempt).
    NEW.fence_token         := GREATEST(COALESCE(NEW.fence_token, 0), NEW.attempts);
    -- run_at (SPEC §15) delays the first attempt like a backoff would, so the claim index and next_claim_at
    -- need nothing more (sql/120_run_at.sql).
    IF v_task.run_at IS NOT NULL AND NEW.state = 'pending' AND NEW.attempts = 0 THEN
        NEW.next_attempt_at := GREATEST(NEW.next_attempt_at, v_task.run_at);
    END IF;
    IF NEW.state IN ('complete', 'error', 'skipped', 'cancelled', 'resolved_manually') THEN
        NEW.completed_at := COALESCE(NEW.completed_at, now());
    END IF;
    RETURN NEW;
END;
$$;

-- The plain-SQL path's (SPEC §2). create_tasks writes its rows complete and validated, and the trigger is not
-- called for them (sql/018_validated_write.sql).
DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE OR REPLACE TRIGGER steps_materialize
    BEFORE INSERT ON stepready.steps
    FOR EACH ROW WHEN (NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._steps_materialize()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;
