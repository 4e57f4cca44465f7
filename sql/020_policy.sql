-- Policy validation and materialization (SPEC §3): every step row carries its resolved retry policy, so a later
-- edit of a preset affects only steps inserted afterwards and readiness never joins presets.

-- Raises a definition error: SQLSTATE 22023, message "<where>: <what>".
CREATE OR REPLACE FUNCTION stepready._definition_error(p_where text, p_what text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION '%: %', p_where, p_what USING ERRCODE = '22023';
END;
$$;

-- A JSON integer in [p_min, p_max], or NULL for JSON null / absent. Anything else is a definition error.
CREATE OR REPLACE FUNCTION stepready._json_integer(p_value jsonb, p_where text, p_min numeric,
                                                   p_max numeric DEFAULT 9223372036854775807)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v numeric;
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'number' THEN
        PERFORM stepready._definition_error(p_where, format('must be an integer >= %s, got %s', p_min, p_value));
    END IF;
    v := p_value::text::numeric;
    IF v <> trunc(v) OR v < p_min THEN
        PERFORM stepready._definition_error(p_where, format('must be an integer >= %s, got %s', p_min, p_value));
    ELSIF v > p_max THEN
        PERFORM stepready._definition_error(p_where, format('must be an integer <= %s, got %s', p_max, p_value));
    END IF;
    RETURN v::bigint;
END;
$$;

-- A JSON integer number of milliseconds in [p_min, _max_duration_ms()] (sql/015_bounds.sql), or NULL for JSON
-- null / absent. Anything else is a definition error.
CREATE OR REPLACE FUNCTION stepready._json_duration_ms(p_value jsonb, p_where text, p_min bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v bigint := stepready._json_integer(p_value, p_where, p_min);
BEGIN
    IF v > 9223372036854 THEN
        PERFORM stepready._definition_error(p_where, stepready._duration_problem(v, p_min));
    END IF;
    RETURN v;
END;
$$;

-- A JSON number in [p_min, p_max], or NULL for JSON null / absent.
CREATE OR REPLACE FUNCTION stepready._json_number(p_value jsonb, p_where text, p_min float8, p_max float8)
RETURNS float8
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v float8;
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'number' THEN
        PERFORM stepready._definition_error(p_where,
            format('must be a number between %s and %s, got %s', p_min, p_max, p_value));
    END IF;
    v := p_value::text::float8;
    IF v < p_min OR v > p_max THEN
        PERFORM stepready._definition_error(p_where,
            format('must be a number between %s and %s, got %s', p_min, p_max, p_value));
    END IF;
    RETURN v;
END;
$$;

-- A JSON string (NULL for JSON null / absent), non-empty unless p_allow_empty.
CREATE OR REPLACE FUNCTION stepready._json_text(p_value jsonb, p_where text, p_allow_empty bool DEFAULT false)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'string' OR (NOT p_allow_empty AND p_value #>> '{}' = '') THEN
        PERFORM stepready._definition_error(p_where, format('must be a non-empty string, got %s', p_value));
    END IF;
    RETURN p_value #>> '{}';
END;
$$;

-- A JSON boolean, or NULL for JSON null / absent.
CREATE OR REPLACE FUNCTION stepready._json_bool(p_value jsonb, p_where text)
RETURNS bool
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'boolean' THEN
        PERFORM stepready._definition_error(p_where, format('must be true or false, got %s', p_value));
    END IF;
    RETURN p_value::text::bool;
END;
$$;

-- Rejects keys of p_object that are not in p_allowed.
CREATE OR REPLACE FUNCTION stepready._reject_unknown_keys(p_object jsonb, p_allowed text[], p_where text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_key text;
BEGIN
    -- The common case, every key allowed, as one expression (no query: this runs for every step created).
    IF jsonb_typeof(p_object) = 'object' AND p_object - p_allowed = '{}'::jsonb THEN
        RETURN;
    END IF;
    SELECT k INTO v_key FROM jsonb_object_keys(p_object) AS k WHERE k <> ALL (p_allowed) ORDER BY k LIMIT 1;
    IF v_key IS NOT NULL THEN
        PERFORM stepready._definition_error(p_where,
            format('unknown field "%s" (allowed: %s)', v_key, array_to_string(p_allowed, ', ')));
    END IF;
END;
$$;

-- Validates a retry object ({policy, max_attempts, retryable, backoff, base_delay_ms, multiplier, max_delay_ms,
-- jitter}) and returns it unchanged. p_where prefixes every message ("steps[0] \"fetch\": retry").
CREATE OR REPLACE FUNCTION stepready._validate_retry(p_retry jsonb, p_where text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_policy  text;
    v_backoff text;
BEGIN
    IF p_retry IS NULL OR jsonb_typeof(p_retry) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_retry) <> 'object' THEN
        PERFORM stepready._definition_error(p_where, format('must be an object, got %s', p_retry));
    END IF;
    PERFORM stepready._reject_unknown_keys(p_retry,
        ARRAY['policy', 'max_attempts', 'retryable', 'backoff', 'base_delay_ms', 'multiplier', 'max_delay_ms',
              'jitter'], p_where);
    v_policy := stepready._json_text(p_retry -> 'policy', p_where || '.policy');
    IF v_policy IS NOT NULL AND NOT EXISTS (SELECT 1 FROM stepready.retry_policies WHERE name = v_policy) THEN
        PERFORM stepready._definition_error(p_where || '.policy', format('unknown preset "%s" (known: %s)',
            v_policy, (SELECT string_agg(name, ', ' ORDER BY name) FROM stepready.retry_policies)));
    END IF;
    PERFORM stepready._json_integer(p_retry -> 'max_attempts', p_where || '.max_attempts', 0, 2147483647);
    PERFORM stepready._json_bool(p_retry -> 'retryable', p_where || '.retryable');
    v_backoff := stepready._json_text(p_retry -> 'backoff', p_where || '.backoff');
    IF v_backoff IS NOT NULL AND v_backoff NOT IN ('none', 'fixed', 'linear', 'exponential') THEN
        PERFORM stepready._definition_error(p_where || '.backoff',
            format('unknown strategy "%s" (known: none, fixed, linear, exponential)', v_backoff));
    END IF;
    PERFORM stepready._json_duration_ms(p_retry -> 'base_delay_ms', p_where || '.base_delay_ms', 0);
    PERFORM stepready._json_number(p_retry -> 'multiplier', p_where || '.multiplier', 1, 1e300);
    PERFORM stepready._json_duration_ms(p_retry -> 'max_delay_ms', p_where || '.max_delay_ms', 0);
    PERFORM stepready._json_number(p_retry -> 'jitter', p_where || '.jitter', 0, 1);
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

CREATE OR REPLACE TRIGGER tasks_validate_retry
    BEFORE INSERT OR UPDATE OF retry ON stepready.tasks
    FOR EACH ROW EXECUTE FUNCTION stepready._tasks_validate_retry();

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
    IF NEW.state NOT IN ('pending', 'enqueued', 'in_progress', 'waiting_for_retry', 'complete', 'error',
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

CREATE OR REPLACE TRIGGER steps_materialize
    BEFORE INSERT ON stepready.steps
    FOR EACH ROW EXECUTE FUNCTION stepready._steps_materialize();
