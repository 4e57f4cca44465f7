-- Signals and durable sleeps (SPEC §20, issue 22; docs/signals.md is the user's page, docs/design-core.md
-- "Signals and durable sleeps" the decisions). Schema version 16: steps.wait, steps.wait_until, state `waiting`,
-- the mailbox stepready.signals.
--
-- A wait step has `wait` instead of a handler (its handler column reads `wait`: it is never claimed). When its
-- dependencies are satisfied it goes from pending straight to `waiting` in the same transaction (_wait_enter,
-- called by the bookkeeping trigger, by create_tasks, by the plain-SQL path's commit-time trigger and by the
-- operators that make it pending again), never through a state a claim could take. Its deadline (the end of a
-- sleep, the timeout of a signal wait) is steps.wait_until, in the partial index steps_wait_due_idx: the claim's
-- prologue fires the due ones (_fire_due_waits) and next_claim_at wakes the daemons at the first one, so a waiting
-- step holds no worker, connection, goroutine or poll of its own.
--
-- Exactly once: both sides of a match take the same transaction-scoped advisory lock of the task (_signal_lock)
-- before they look at the other side, and each looks in a statement after it, so under READ COMMITTED it sees
-- what the other committed. send_signal: lock, then the oldest waiting step of the name (delivered to it) or the
-- mailbox (buffered). A step starting to wait: lock, then the oldest unconsumed signal of its name (consumed) or
-- `waiting`. Whoever comes second sees the first's commit; nobody sees the other half-done.

-- The transaction-scoped advisory lock of a task's mailbox (two-int form: its own lock space, apart from the
-- maintenance services' bigint keys). Key: 'Sig' and the high bits of the id, then its low 31 bits, so that no two
-- tasks share one.
CREATE OR REPLACE FUNCTION stepready._signal_lock(p_task_id bigint)
RETURNS void
LANGUAGE sql
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(1399418624 + (p_task_id >> 31)::int, (p_task_id & 2147483647)::int);
$$;

-- The same lock without waiting: true when taken (the timers skip a task whose mailbox is busy).
CREATE OR REPLACE FUNCTION stepready._signal_try_lock(p_task_id bigint)
RETURNS bool
LANGUAGE sql
AS $$
    SELECT pg_catalog.pg_try_advisory_xact_lock(1399418624 + (p_task_id >> 31)::int, (p_task_id & 2147483647)::int);
$$;

-- An RFC 3339 time (2026-11-25T18:00:00Z, with a fraction or an offset), or NULL when p_text is not one. Never
-- raises.
CREATE OR REPLACE FUNCTION stepready._rfc3339(p_text text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_text IS NULL OR p_text !~ '^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$' THEN
        RETURN NULL;
    END IF;
    RETURN p_text::timestamptz;
EXCEPTION WHEN OTHERS THEN
    RETURN NULL; -- a date that does not exist (2026-02-30), an hour past 23
END;
$$;

-- What is wrong with a step's `wait` (SPEC §20), as the end of a message starting with `steps[i] "name": wait`,
-- or NULL. p_parents: the step's depends_on (a ${deps.NAME} in until must name one); NULL on the plain-SQL path,
-- whose edges come after the step (there a reference to a step that is not a parent fails the step when it starts
-- waiting, as a missing path does).
CREATE OR REPLACE FUNCTION stepready._wait_problem(p_wait jsonb, p_parents text[])
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_problem text;
    v_until   text;
    v_n       int;
    v_path    text[];
    v_ref     text;
BEGIN
    IF jsonb_typeof(p_wait) IS DISTINCT FROM 'object' THEN
        RETURN format(': must be an object ({"signal": NAME}, {"duration_ms": N} or {"until": TIME}), got %s',
                      COALESCE(p_wait::text, 'nothing'));
    END IF;
    v_problem := stepready._unknown_keys_problem(p_wait,
        ARRAY['signal', 'timeout_ms', 'on_timeout', 'duration_ms', 'until']);
    IF v_problem IS NOT NULL THEN
        RETURN ': ' || v_problem;
    END IF;
    IF (p_wait ? 'signal')::int + (p_wait ? 'duration_ms')::int + (p_wait ? 'until')::int <> 1 THEN
        RETURN ': must have exactly one of signal, duration_ms and until';
    END IF;
    IF NOT p_wait ? 'signal' AND (p_wait ? 'timeout_ms' OR p_wait ? 'on_timeout') THEN
        RETURN format(': %s goes with signal only (a sleep ends by itself)',
                      CASE WHEN p_wait ? 'timeout_ms' THEN 'timeout_ms' ELSE 'on_timeout' END);
    END IF;
    IF p_wait ? 'signal' THEN
        IF jsonb_typeof(p_wait -> 'signal') IS DISTINCT FROM 'string' OR p_wait ->> 'signal' = '' THEN
            RETURN format('.signal: must be a non-empty string, got %s', p_wait -> 'signal');
        END IF;
        IF char_length(p_wait ->> 'signal') > 255 THEN
            RETURN '.signal: ' || stepready._name_problem(p_wait ->> 'signal');
        END IF;
        IF jsonb_typeof(p_wait -> 'timeout_ms') = 'null' THEN
            RETURN '.timeout_ms: must be an integer >= 0, got null';
        END IF;
        v_problem := stepready._duration_ms_problem(p_wait -> 'timeout_ms', 0);
        IF v_problem IS NOT NULL THEN
            RETURN '.timeout_ms: ' || v_problem;
        END IF;
        IF p_wait ? 'on_timeout' AND (jsonb_typeof(p_wait -> 'on_timeout') IS DISTINCT FROM 'string'
                                      OR p_wait ->> 'on_timeout' NOT IN ('fail', 'continue')) THEN
            RETURN format('.on_timeout: must be fail or continue, got %s', p_wait -> 'on_timeout');
        END IF;
    ELSIF p_wait ? 'duration_ms' THEN
        IF jsonb_typeof(p_wait -> 'duration_ms') = 'null' THEN
            RETURN '.duration_ms: must be an integer >= 0, got null';
        END IF;
        v_problem := stepready._duration_ms_problem(p_wait -> 'duration_ms', 0);
        IF v_problem IS NOT NULL THEN
            RETURN '.duration_ms: ' || v_problem;
        END IF;
    ELSE
        IF jsonb_typeof(p_wait -> 'until') IS DISTINCT FROM 'string' THEN
            RETURN format('.until: must be an RFC 3339 time or a reference, got %s', p_wait -> 'until');
        END IF;
        v_until := p_wait ->> 'until';
        IF strpos(v_until, '${') > 0 THEN
            SELECT count(*), (array_agg(p.problem) FILTER (WHERE p.problem IS NOT NULL))[1],
                   (array_agg(p.ref) FILTER (WHERE p.ref IS NOT NULL))[1]
              INTO v_n, v_problem, v_ref
              FROM stepready._ref_parse(v_until) p;
            SELECT p.path INTO v_path FROM stepready._ref_parse(v_until) p WHERE p.ref IS NOT NULL LIMIT 1;
            IF v_problem IS NOT NULL THEN
                RETURN '.until: ' || v_problem;
            END IF;
            IF v_n <> 1 OR v_ref IS NULL OR v_path[1] NOT IN ('deps', 'context') THEN
                RETURN format('.until: must be an RFC 3339 time or exactly one reference (${deps.NAME.PATH} or '
                              '${context.PATH}), got %s', p_wait -> 'until');
            END IF;
            IF v_path[1] = 'deps' AND p_parents IS NOT NULL AND NOT v_path[2] = ANY (p_parents) THEN
                RETURN format('.until: reference %s names step "%s", which is not a direct parent (depends_on)',
                              v_ref, v_path[2]);
            END IF;
        ELSIF stepready._rfc3339(v_until) IS NULL THEN
            RETURN format('.until: must be an RFC 3339 time (2026-11-25T18:00:00Z) or a reference, got %s',
                          p_wait -> 'until');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- What is wrong with a step that has `wait`, besides the wait itself: the fields that have no meaning for it
-- (a handler, rules, a map), as the end of a message starting with `steps[i] "name"`, or NULL.
CREATE OR REPLACE FUNCTION stepready._wait_step_problem(p_step jsonb)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN p_step ? 'handler' THEN ': handler and wait: a step has one or the other, not both'
        WHEN p_step ? 'map' THEN ': map and wait: a map step runs a handler per element; a wait step has none'
        WHEN p_step ? 'rules' THEN ': rules and wait: rules judge a handler''s attempts; a wait step has none'
    END;
$$;

-- Steps start waiting (SPEC §20): the steps p_ids that are wait steps, pending (or waiting_for_retry, after
-- retry_step_now) with every parent satisfied, become `waiting` as of p_at: their one attempt begins (attempts and
-- the fencing token + 1), their deadline is set (a sleep's end; a signal wait's timeout), an `until` reference is
-- resolved against the step's deps and the task's context (a missing path or a value that is not an RFC 3339 time
-- fails the step `deterministic`, naming it). Then, under each task's mailbox lock, every signal wait takes the
-- oldest unconsumed signal of its name, if any (several steps of one name: the oldest step the oldest signal).
-- The caller holds the rows (it has just updated or inserted them); others are left alone. SECURITY DEFINER
-- (migrations/roles): a client's plain INSERT reaches it through the commit-time trigger, and it writes the
-- mailbox; it takes only rows that may start waiting now, so a direct call does nothing a transition would not.
CREATE OR REPLACE FUNCTION stepready._wait_enter(p_ids bigint[], p_at timestamptz)
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids     bigint[];
    v_failed  bigint[];
    v_errors  jsonb[];
    v_tasks   bigint[];
    v_steps   bigint[];
    v_signals bigint[];
    v_n       int;
BEGIN
    IF p_ids IS NULL OR cardinality(p_ids) = 0 THEN
        RETURN 0;
    END IF;
    p_at := COALESCE(p_at, now());
    -- 1. Into `waiting`, with the deadline; an `until` reference resolved here (the only per-row call).
    PERFORM 1 FROM stepready.steps s
     WHERE s.id = ANY (p_ids) AND s.wait IS NOT NULL AND s.state IN ('pending', 'waiting_for_retry')
       AND s.pending_parents = 0
     ORDER BY s.id
       FOR UPDATE;
    WITH c AS (
        SELECT s.id, s.wait, s.state AS from_state, r.value AS r_value, r.problem AS r_problem,
               -- A delayed task (SPEC §15) starts its clocks at run_at: a sleep or a timeout counts from the later
               -- of the moment the wait begins and the task's run_at.
               GREATEST(p_at, (SELECT t.run_at FROM stepready.tasks t WHERE t.id = s.task_id)) AS clock,
               r.value IS NOT NULL OR r.problem IS NOT NULL AS is_ref
          FROM stepready.steps s
          -- The subquery's filter on the outer row skips the resolution for every wait but an `until` reference.
          LEFT JOIN LATERAL (SELECT x.value, x.problem
                               FROM stepready._resolve_value(s.wait -> 'until',
                                        jsonb_build_object('deps', CASE WHEN s.wait ? 'until' AND strpos(s.wait ->> 'until', '${') > 0
                                                                        THEN stepready._step_deps(s.id) END,
                                            'context', (SELECT t.context FROM stepready.tasks t WHERE t.id = s.task_id),
                                            'task', jsonb_build_object('id', s.task_id))) x
                              WHERE s.wait ? 'until' AND strpos(s.wait ->> 'until', '${') > 0) r ON true
         WHERE s.id = ANY (p_ids) AND s.wait IS NOT NULL AND s.state IN ('pending', 'waiting_for_retry')
           AND s.pending_parents = 0
    ), d AS (
        SELECT c.id, c.from_state,
               CASE WHEN c.wait ? 'signal' THEN c.clock + (c.wait ->> 'timeout_ms')::bigint * interval '1 millisecond'
                    WHEN c.wait ? 'duration_ms' THEN c.clock + (c.wait ->> 'duration_ms')::bigint * interval '1 millisecond'
                    WHEN NOT c.is_ref THEN stepready._rfc3339(c.wait ->> 'until')
                    WHEN c.r_problem IS NULL AND jsonb_typeof(c.r_value) = 'string'
                        THEN stepready._rfc3339(c.r_value #>> '{}') END AS until,
               CASE WHEN NOT c.is_ref THEN NULL
                    WHEN c.r_problem IS NOT NULL THEN 'wait.until: ' || c.r_problem
                    WHEN jsonb_typeof(c.r_value) <> 'string' OR stepready._rfc3339(c.r_value #>> '{}') IS NULL
                        THEN format('wait.until: reference %s is %s, not an RFC 3339 time', c.wait ->> 'until',
                                    left(c.r_value::text, 100)) END AS problem
          FROM c
    ), upd AS (
        UPDATE stepready.steps s
           SET state = 'waiting', attempts = s.attempts + 1, fence_token = s.fence_token + 1,
               last_attempted_at = p_at, next_attempt_at = NULL, wait_until = d.until, updated_at = now()
          FROM d
         WHERE s.id = d.id
        RETURNING s.*, d.from_state, d.problem
    ), logged AS (
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT u.task_id, u.id, u.attempts, u.iteration, 'wait.started', u.from_state, 'waiting',
               jsonb_strip_nulls(jsonb_build_object('signal', u.wait ->> 'signal', 'until', u.wait_until)), p_at
          FROM upd u ORDER BY u.id
    )
    SELECT array_agg(u.id ORDER BY u.id) FILTER (WHERE u.problem IS NULL),
           array_agg(u.id ORDER BY u.id) FILTER (WHERE u.problem IS NOT NULL),
           array_agg(jsonb_build_object('class', 'deterministic', 'code', 'wait_until', 'message', u.problem)
                     ORDER BY u.id) FILTER (WHERE u.problem IS NOT NULL),
           array_agg(DISTINCT u.task_id) FILTER (WHERE u.problem IS NULL AND u.wait ? 'signal')
      INTO v_ids, v_failed, v_errors, v_tasks
      FROM upd u;
    v_n := COALESCE(cardinality(v_ids), 0);

    -- 2. An `until` that does not resolve fails the step at once (one attempt, no retry; on_exhausted applies).
    IF v_failed IS NOT NULL THEN
        PERFORM stepready._wait_fail(v_failed, v_errors, p_at);
    END IF;

    -- 3. The mailbox, under each task's lock (ascending task id), in a statement after it: every signal committed
    -- before the lock was granted is seen. Steps of one task and name pair with its signals in id order.
    IF v_tasks IS NOT NULL THEN
        PERFORM stepready._signal_lock(x.id) FROM (SELECT unnest(v_tasks) AS id ORDER BY 1) x;
        WITH w AS (
            SELECT s.id, s.task_id, s.wait ->> 'signal' AS name,
                   row_number() OVER (PARTITION BY s.task_id, s.wait ->> 'signal' ORDER BY s.id) AS n
              FROM stepready.steps s
             WHERE s.id = ANY (v_ids) AND s.state = 'waiting' AND s.wait ? 'signal'
        ), g AS (
            SELECT k.task_id, k.name, x.id AS signal_id, row_number() OVER (PARTITION BY k.task_id, k.name ORDER BY x.id) AS n
              FROM (SELECT w.task_id, w.name, count(*) AS m FROM w GROUP BY w.task_id, w.name) k
             CROSS JOIN LATERAL (SELECT g.id FROM stepready.signals g
                                  WHERE g.task_id = k.task_id AND g.name = k.name AND g.consumed_by IS NULL
                                  ORDER BY g.id LIMIT k.m) x
        )
        SELECT array_agg(w.id ORDER BY w.id), array_agg(g.signal_id ORDER BY w.id)
          INTO v_steps, v_signals
          FROM w JOIN g ON g.task_id = w.task_id AND g.name = w.name AND g.n = w.n;
        IF v_steps IS NOT NULL THEN
            PERFORM stepready._signal_deliver(v_steps, v_signals, p_at);
        END IF;
    END IF;
    RETURN v_n;
END;
$$;

-- Delivers signals to waiting steps (entry i: step p_step_ids[i] takes signal p_signal_ids[i]); the caller holds
-- the tasks' mailbox locks and the steps are `waiting`. The signal is marked consumed by the step; the step
-- completes with the payload as its output (its dependents proceed through the bookkeeping trigger, as for any
-- completion: SPEC §6). Events: signal.delivered, step.completed.
CREATE OR REPLACE FUNCTION stepready._signal_deliver(p_step_ids bigint[], p_signal_ids bigint[], p_at timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    WITH pairs AS (
        SELECT x.step_id, x.signal_id FROM unnest(p_step_ids, p_signal_ids) AS x(step_id, signal_id)
    ), sig AS (
        UPDATE stepready.signals g
           SET consumed_by = p.step_id, consumed_at = p_at
          FROM pairs p
         WHERE g.id = p.signal_id AND g.consumed_by IS NULL
        RETURNING g.id, g.name, g.payload, p.step_id
    ), done AS (
        UPDATE stepready.steps s
           SET state = 'complete', output = sig.payload, wait_until = NULL, completed_at = p_at, updated_at = now()
          FROM sig
         WHERE s.id = sig.step_id AND s.state = 'waiting'
        RETURNING s.id, s.task_id, s.attempts, s.iteration, sig.id AS signal_id, sig.name
    )
    INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state, details, at)
    SELECT d.task_id, d.id, d.attempts, d.iteration, e.event, e.from_state, e.to_state,
           jsonb_build_object('signal', d.name, 'signal_id', d.signal_id), p_at
      FROM done d
     CROSS JOIN LATERAL (VALUES (1, 'signal.delivered', 'waiting', 'waiting'),
                                (2, 'step.completed', 'waiting', 'complete')) AS e(n, event, from_state, to_state)
     ORDER BY d.id, e.n;
END;
$$;

-- Waiting steps that end without a signal and without success: state `error` with last_error (class, message,
-- code, reason, attempt), then on_exhausted (skip: skipped; skip_cascade: skipped with its descendants;
-- fail_task: the task goes to error through its counters). No retry: a wait has one attempt. p_errors[i] is the
-- error of step p_ids[i] (class, message, code).
CREATE OR REPLACE FUNCTION stepready._wait_fail(p_ids bigint[], p_errors jsonb[], p_at timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        WITH f AS (
            UPDATE stepready.steps s
               SET state = CASE WHEN s.on_exhausted = 'fail_task' THEN 'error' ELSE 'skipped' END,
                   last_error = x.err || jsonb_build_object('reason', 'not_retryable', 'attempt', s.attempts),
                   wait_until = NULL, completed_at = p_at, updated_at = now()
              FROM unnest(p_ids, p_errors) AS x(id, err)
             WHERE s.id = x.id AND s.state = 'waiting'
            RETURNING s.id, s.task_id, s.name, s.attempts, s.iteration, s.state, s.on_exhausted, s.last_error
        )
        SELECT * FROM f ORDER BY f.id
    LOOP
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        VALUES (r.task_id, r.id, r.attempts, r.iteration, CASE WHEN r.state = 'error' THEN 'step.failed'
                                                                ELSE 'step.skipped' END,
                'waiting', r.state, r.last_error || jsonb_build_object('on_exhausted', r.on_exhausted), p_at);
        IF r.on_exhausted = 'skip_cascade' THEN
            PERFORM stepready._skip_descendants(r.id, r.name, p_at);
        END IF;
    END LOOP;
END;
$$;

-- The timers (SPEC §20): waiting steps whose deadline is at or before p_as_of, at most p_limit, oldest deadline
-- first. A sleep completes with output {"slept_until": its deadline}; a signal wait times out: `on_timeout:
-- continue` completes it with output null, `fail` fails it with class `timeout` (on_exhausted applies, no retry).
-- Rows locked with SKIP LOCKED, and a task whose mailbox lock is taken (a signal being sent to it right now) is
-- left for the next round, so a timeout and a delivery never both happen. Called by the claims' prologue
-- (_claim_begin), so any worker that speaks the SQL protocol fires them. Returns how many it ended.
CREATE OR REPLACE FUNCTION stepready._fire_due_waits(p_as_of timestamptz, p_limit int DEFAULT 1000)
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids    bigint[];
    v_fail   bigint[];
    v_errors jsonb[];
    v_n      int;
BEGIN
    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids
      FROM (SELECT s.id, s.task_id FROM stepready.steps s
             WHERE s.state = 'waiting' AND s.wait_until <= p_as_of
             ORDER BY s.wait_until, s.id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED) x
     WHERE stepready._signal_try_lock(x.task_id);
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    v_n := cardinality(v_ids);

    -- Timeouts first recorded as such (wait.timed_out), then what follows.
    INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state, details, at)
    SELECT s.task_id, s.id, s.attempts, s.iteration, 'wait.timed_out', 'waiting', 'waiting',
           jsonb_build_object('signal', s.wait ->> 'signal', 'timeout_ms', (s.wait ->> 'timeout_ms')::bigint,
                              'deadline', s.wait_until, 'on_timeout', COALESCE(s.wait ->> 'on_timeout', 'fail')),
           p_as_of
      FROM stepready.steps s
     WHERE s.id = ANY (v_ids) AND s.wait ? 'signal'
     ORDER BY s.id;

    -- Sleeps, and timeouts that continue: complete.
    WITH done AS (
        UPDATE stepready.steps s
           SET state = 'complete',
               output = CASE WHEN s.wait ? 'signal' THEN 'null'::jsonb
                             ELSE jsonb_build_object('slept_until', s.wait_until) END,
               completed_at = p_as_of, updated_at = now(), wait_until = NULL
         WHERE s.id = ANY (v_ids)
           AND (NOT s.wait ? 'signal' OR s.wait ->> 'on_timeout' = 'continue')
        RETURNING s.id, s.task_id, s.attempts, s.iteration, s.output, s.wait
    )
    INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state, details, at)
    SELECT d.task_id, d.id, d.attempts, d.iteration, 'step.completed', 'waiting', 'complete',
           CASE WHEN d.wait ? 'signal' THEN jsonb_build_object('timed_out', true)
                ELSE jsonb_build_object('slept_until', d.output -> 'slept_until') END, p_as_of
      FROM done d ORDER BY d.id;

    -- Timeouts that fail.
    SELECT array_agg(s.id ORDER BY s.id),
           array_agg(jsonb_build_object('class', 'timeout', 'code', 'wait_timeout',
                                        'message', format('no signal "%s" within %s ms', s.wait ->> 'signal',
                                                          s.wait ->> 'timeout_ms'))
                     ORDER BY s.id)
      INTO v_fail, v_errors
      FROM stepready.steps s
     WHERE s.id = ANY (v_ids) AND s.state = 'waiting';
    IF v_fail IS NOT NULL THEN
        PERFORM stepready._wait_fail(v_fail, v_errors, p_as_of);
    END IF;
    RETURN v_n;
END;
$$;

-- Sends signal p_name with p_payload to task p_task_id (SPEC §20) and returns its id. Under the task's mailbox
-- lock: a repeated p_idempotency_key returns the first signal's id and changes nothing (checked first, so a
-- webhook retried after its signal finished the task still gets its id); a missing task raises P0002; a task that
-- is complete, error or cancelled, or none of whose non-terminal steps waits for p_name, or whose every such step
-- has an unconsumed signal of that name already, refuses with 55000 (nothing is buffered that nobody will read).
-- Otherwise the oldest step waiting for p_name gets it now (it completes with the payload as its output), or,
-- when none waits yet, it is buffered for the first that starts to. A payload larger than
-- settings.max_output_bytes (it would become a step's output) refuses with 54000. Events: signal.received (a task
-- event, with details.actor as for operators: stepready.actor), and signal.delivered with the step's completion.
-- SECURITY DEFINER (migrations/roles): clients and operators send signals without write rights on steps.
CREATE OR REPLACE FUNCTION stepready.send_signal(p_task_id bigint, p_name text, p_payload jsonb DEFAULT '{}',
                                                 p_idempotency_key text DEFAULT NULL,
                                                 p_as_of timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_payload jsonb := COALESCE(p_payload, '{}');
    v_size    bigint;
    v_max     bigint;
    v_id      bigint;
    v_status  text;
    v_readers int;
    v_queued  int;
    v_step    bigint;
BEGIN
    IF p_task_id IS NULL THEN
        RAISE EXCEPTION 'send_signal: p_task_id must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF p_name IS NULL OR p_name = '' THEN
        RAISE EXCEPTION 'send_signal: p_name must be a non-empty signal name' USING ERRCODE = '22023';
    END IF;
    IF char_length(p_name) > 255 THEN
        RAISE EXCEPTION 'send_signal: p_name must be at most 255 characters, got %', char_length(p_name)
            USING ERRCODE = '22023';
    END IF;
    IF p_idempotency_key = '' THEN
        RAISE EXCEPTION 'send_signal: p_idempotency_key must be NULL or non-empty' USING ERRCODE = '22023';
    END IF;
    IF p_as_of IS NULL THEN
        RAISE EXCEPTION 'send_signal: p_as_of must not be NULL' USING ERRCODE = '22023';
    END IF;
    v_size := octet_length(v_payload::text);
    v_max := stepready._max_output_bytes(); -- read once: it is a lookup of stepready.settings
    IF v_size > v_max THEN
        RAISE EXCEPTION 'signal "%" to task %: payload is % bytes, over the limit of % bytes (a payload becomes a step''s output: stepready.settings max_output_bytes)',
            p_name, p_task_id, v_size, v_max USING ERRCODE = '54000';
    END IF;

    PERFORM stepready._signal_lock(p_task_id);
    -- Everything below reads in statements after the lock: what the other side committed before it is seen.
    IF p_idempotency_key IS NOT NULL THEN
        SELECT g.id INTO v_id FROM stepready.signals g
         WHERE g.task_id = p_task_id AND g.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN v_id;
        END IF;
    END IF;
    SELECT t.status INTO v_status FROM stepready.tasks t WHERE t.id = p_task_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot send signal "%": task % does not exist', p_name, p_task_id USING ERRCODE = 'P0002';
    END IF;
    IF v_status IN ('complete', 'error', 'cancelled') THEN
        RAISE EXCEPTION 'cannot send signal "%" to task %: the task is %', p_name, p_task_id, v_status
            USING ERRCODE = '55000';
    END IF;

    -- The oldest step waiting for it now. Its row lock is waited for: whoever holds a waiting step's row holds
    -- no mailbox lock it could want from us (the timers only try theirs; operators take the mailbox lock first).
    SELECT s.id INTO v_step FROM stepready.steps s
     WHERE s.task_id = p_task_id AND s.state = 'waiting' AND s.wait ? 'signal' AND s.wait ->> 'signal' = p_name
     ORDER BY s.id LIMIT 1
       FOR UPDATE;
    IF v_step IS NULL THEN
        SELECT count(*) INTO v_readers FROM stepready.steps s
         WHERE s.task_id = p_task_id AND s.wait ->> 'signal' = p_name AND NOT stepready._is_terminal(s.state);
        IF v_readers = 0 THEN
            RAISE EXCEPTION 'cannot send signal "%" to task %: no step of it that is not finished waits for "%"',
                p_name, p_task_id, p_name USING ERRCODE = '55000';
        END IF;
        SELECT count(*) INTO v_queued FROM stepready.signals g
         WHERE g.task_id = p_task_id AND g.name = p_name AND g.consumed_by IS NULL;
        IF v_queued >= v_readers THEN
            RAISE EXCEPTION 'cannot send signal "%" to task %: its % step(s) waiting for "%" have % signal(s) buffered already',
                p_name, p_task_id, v_readers, p_name, v_queued USING ERRCODE = '55000';
        END IF;
    END IF;

    -- A signal delivered at once is written consumed (no second version of its row), and the step it completes,
    -- whose row this call holds, is updated once: what _signal_deliver does, without reading either again.
    INSERT INTO stepready.signals (task_id, name, payload, idempotency_key, created_at, consumed_by, consumed_at)
    VALUES (p_task_id, p_name, v_payload, p_idempotency_key, p_as_of, v_step,
            CASE WHEN v_step IS NOT NULL THEN p_as_of END)
    RETURNING id INTO v_id;
    PERFORM stepready._log_task(p_task_id, 'signal.received',
        jsonb_build_object('signal', p_name, 'signal_id', v_id, 'idempotency_key', p_idempotency_key,
                           'delivered_to', v_step, 'buffered', v_step IS NULL, 'bytes', v_size), p_as_of);
    IF v_step IS NOT NULL THEN
        WITH done AS (
            UPDATE stepready.steps s
               SET state = 'complete', output = v_payload, wait_until = NULL, completed_at = p_as_of,
                   updated_at = now()
             WHERE s.id = v_step
            RETURNING s.id, s.task_id, s.attempts, s.iteration
        )
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT d.task_id, d.id, d.attempts, d.iteration, e.event, e.from_state, e.to_state,
               jsonb_build_object('signal', p_name, 'signal_id', v_id), p_as_of
          FROM done d
         CROSS JOIN (VALUES (1, 'signal.delivered', 'waiting', 'waiting'),
                            (2, 'step.completed', 'waiting', 'complete')) AS e(n, event, from_state, to_state)
         ORDER BY e.n;
    END IF;
    RETURN v_id;
END;
$$;

-- send_signal addressed by the task's idempotency key (SPEC §20): P0002 when no task has it.
CREATE OR REPLACE FUNCTION stepready.send_signal_to_key(p_task_idempotency_key text, p_name text,
                                                        p_payload jsonb DEFAULT '{}',
                                                        p_idempotency_key text DEFAULT NULL,
                                                        p_as_of timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_task bigint;
BEGIN
    IF p_task_idempotency_key IS NULL OR p_task_idempotency_key = '' THEN
        RAISE EXCEPTION 'send_signal_to_key: p_task_idempotency_key must be a non-empty key' USING ERRCODE = '22023';
    END IF;
    SELECT t.id INTO v_task FROM stepready.tasks t WHERE t.idempotency_key = p_task_idempotency_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot send signal "%": no task has idempotency key "%"', p_name, p_task_idempotency_key
            USING ERRCODE = 'P0002';
    END IF;
    RETURN stepready.send_signal(v_task, p_name, p_payload, p_idempotency_key, p_as_of);
END;
$$;

-- The plain-SQL path (SPEC §2): a wait step inserted by hand starts waiting when the transaction commits (its
-- edges come after it), if it has no parent by then. Not queued for create_tasks' rows (it calls _wait_enter
-- itself). SECURITY DEFINER (migrations/roles): a client may insert steps but not update them.
CREATE OR REPLACE FUNCTION stepready._steps_wait_inserted()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM stepready._wait_enter(ARRAY[NEW.id], now());
    RETURN NULL;
END;
$$;

-- A constraint trigger has no CREATE OR REPLACE: dropped and created again on every migrate up.
DROP TRIGGER IF EXISTS steps_wait_inserted ON stepready.steps;
DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE CONSTRAINT TRIGGER steps_wait_inserted
    AFTER INSERT ON stepready.steps
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.wait IS NOT NULL AND NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._steps_wait_inserted()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;
