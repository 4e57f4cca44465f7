-- Operator functions (SPEC §9). Each one audits itself in step_events and refuses impossible transitions with
-- SQLSTATE 55000 and a message naming the task or step and its state.

-- The details of an operator event, with who acted when the caller said so: a session or transaction setting
-- stepready.actor (the web console sets 'ui', the CLI 'cli') becomes details.actor. The functions' signatures
-- stay as SPEC §9 has them.
CREATE OR REPLACE FUNCTION stepready._operator_details(p_details jsonb)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE(p_details, '{}')
           || CASE WHEN COALESCE(current_setting('stepready.actor', true), '') = '' THEN '{}'::jsonb
                   ELSE jsonb_build_object('actor', current_setting('stepready.actor', true)) END;
$$;

-- Appends a task-level operator event (details.actor added, see _operator_details).
CREATE OR REPLACE FUNCTION stepready._log_task(p_task_id bigint, p_event text, p_details jsonb, p_at timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO stepready.step_events (task_id, event, details, at)
    VALUES (p_task_id, p_event, stepready._operator_details(p_details), COALESCE(p_at, clock_timestamp()));
END;
$$;

-- Returns the task row locked, or raises P0002.
CREATE OR REPLACE FUNCTION stepready._lock_task(p_task_id bigint)
RETURNS stepready.tasks
LANGUAGE plpgsql
AS $$
DECLARE
    t stepready.tasks;
BEGIN
    SELECT * INTO t FROM stepready.tasks WHERE id = p_task_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % does not exist', p_task_id USING ERRCODE = 'P0002';
    END IF;
    RETURN t;
END;
$$;

-- Locks every step of a task (ascending id) and then the task row, and returns the task. Everything in stepready
-- locks steps before their task (the lifecycle functions lock a step and their triggers then update the task;
-- prune_tasks locks a task's steps before the task), so every operator takes this order to never deadlock with
-- a worker finishing a step, with the pruner or with another operator (docs/design-core.md, "Lock order").
-- Locking every step up front also covers the steps the triggers then change (children, the task's claimable
-- steps when it stops or starts being runnable).
--
-- One exception remains: a lifecycle function locks its own step before the other steps of the task its triggers
-- change (a child whose count of unsatisfied parents moves, the claimable steps of a task that stops or starts
-- being runnable), which may come first in id order. When such a worker and an operator meet on one task,
-- PostgreSQL finds the cycle after deadlock_timeout and aborts one of the two: a worker retries its call
-- (40P01 is retried); an operator's locking runs in a block of its own, rolled back and retried here, so an
-- operator never fails with 40P01 (after _lock_retries tries it gives up with the error).
CREATE OR REPLACE FUNCTION stepready._lock_task_and_steps(p_task_id bigint)
RETURNS stepready.tasks
LANGUAGE plpgsql
AS $$
DECLARE
    v_try int := 0;
BEGIN
    LOOP
        BEGIN
            -- The task's mailbox lock first (SPEC §20, sql/059_signals.sql): an operator may make a wait step
            -- start waiting again (reset_task, retry_step_now), which reads the mailbox under it, and a sender
            -- that holds it waits for the row of a waiting step; taken before the steps, it never closes a cycle
            -- with a sender. (A worker whose completion starts a wait step holds that step and then wants the
            -- lock: the cycle with an operator is broken here, as the one below.)
            PERFORM stepready._signal_lock(p_task_id);
            PERFORM 1 FROM stepready.steps WHERE task_id = p_task_id ORDER BY id FOR UPDATE;
            RETURN stepready._lock_task(p_task_id);
        EXCEPTION WHEN deadlock_detected THEN
            v_try := v_try + 1;
            IF v_try >= stepready._lock_retries() THEN
                RAISE;
            END IF;
        END;
    END LOOP;
END;
$$;

-- How many times an operator's locking is tried when PostgreSQL breaks a deadlock by aborting it.
CREATE OR REPLACE FUNCTION stepready._lock_retries()
RETURNS int
LANGUAGE sql IMMUTABLE
AS $$
    SELECT 10;
$$;

-- The step-level operators' lock: every step of the step's task (ascending id), then the task row, as
-- _lock_task_and_steps. Returns the step and its task, locked; raises P0002 when the step does not exist (or its
-- task was deleted while we waited).
CREATE OR REPLACE FUNCTION stepready._lock_step_and_task(p_step_id bigint, OUT p_step stepready.steps,
                                                         OUT p_task stepready.tasks)
LANGUAGE plpgsql
AS $$
DECLARE
    v_task_id bigint;
BEGIN
    SELECT task_id INTO v_task_id FROM stepready.steps WHERE id = p_step_id;
    IF FOUND THEN
        BEGIN
            p_task := stepready._lock_task_and_steps(v_task_id);
        EXCEPTION WHEN no_data_found THEN
            NULL; -- the task was deleted (pruned) while we waited: so was the step
        END;
        SELECT * INTO p_step FROM stepready.steps WHERE id = p_step_id;
    END IF;
    IF p_step.id IS NULL THEN
        RAISE EXCEPTION 'step % does not exist', p_step_id USING ERRCODE = 'P0002';
    END IF;
END;
$$;

-- What an operator event records about a running attempt it leaves behind (an orphaned lease), '{}' when none.
CREATE OR REPLACE FUNCTION stepready._orphan_details(p_step stepready.steps)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN p_step.state = 'in_progress'
                THEN jsonb_build_object('attempt_still_running', true, 'lease_owner', p_step.lease_owner,
                                        'lease_expires_at', p_step.lease_expires_at)
                ELSE '{}'::jsonb END;
$$;

CREATE OR REPLACE FUNCTION stepready._refuse(p_message text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = '55000';
END;
$$;

-- Cancels a task: every non-terminal step becomes cancelled. A running attempt is fenced out (its heartbeat and
-- its result are refused) and keeps its lease, orphaned, until its worker reports or the lease expires: its
-- concurrency slot stays taken while the handler may still run (sql/046_leases.sql). Returns how many steps were
-- cancelled.
CREATE OR REPLACE FUNCTION stepready.cancel_task(p_task_id bigint, p_reason text DEFAULT NULL,
                                                 p_as_of timestamptz DEFAULT now())
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    t stepready.tasks := stepready._lock_task_and_steps(p_task_id);
    s stepready.steps;
    k int := 0;
BEGIN
    IF t.status IN ('complete', 'cancelled') THEN
        PERFORM stepready._refuse(format('cannot cancel task %s: it is already %s', t.id, t.status));
    END IF;
    UPDATE stepready.tasks SET status = 'cancelled', completed_at = p_as_of WHERE id = t.id;
    FOR s IN SELECT * FROM stepready.steps WHERE task_id = t.id AND NOT stepready._is_terminal(state)
              ORDER BY id FOR UPDATE
    LOOP
        UPDATE stepready.steps SET state = 'cancelled', next_attempt_at = NULL, completed_at = p_as_of WHERE id = s.id;
        PERFORM stepready._log(s, 'step.cancelled', s.state, 'cancelled',
            jsonb_build_object('reason', p_reason) || stepready._orphan_details(s), p_as_of);
        k := k + 1;
    END LOOP;
    PERFORM stepready._log_task(t.id, 'operator.cancel',
        jsonb_build_object('reason', p_reason, 'previous_status', t.status, 'steps_cancelled', k), p_as_of);
    RETURN k;
END;
$$;

-- Pauses a task: no step of it is claimed or started until resume_task. False when it was already paused.
CREATE OR REPLACE FUNCTION stepready.pause_task(p_task_id bigint, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    t stepready.tasks := stepready._lock_task_and_steps(p_task_id);
BEGIN
    IF t.status IN ('complete', 'cancelled') THEN
        PERFORM stepready._refuse(format('cannot pause task %s: it is %s', t.id, t.status));
    END IF;
    IF t.paused THEN
        RETURN false;
    END IF;
    UPDATE stepready.tasks SET paused = true WHERE id = t.id;
    PERFORM stepready._log_task(t.id, 'operator.pause', jsonb_build_object('status', t.status), p_as_of);
    RETURN true;
END;
$$;

-- Resumes a paused task. False when it was not paused.
CREATE OR REPLACE FUNCTION stepready.resume_task(p_task_id bigint, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    t stepready.tasks := stepready._lock_task_and_steps(p_task_id);
BEGIN
    IF NOT t.paused THEN
        RETURN false;
    END IF;
    UPDATE stepready.tasks SET paused = false WHERE id = t.id;
    PERFORM stepready._log_task(t.id, 'operator.resume', jsonb_build_object('status', t.status), p_as_of);
    RETURN true;
END;
$$;

-- Retry now: clears the backoff of a waiting step; on a step in error grants exactly one more attempt (even
-- after a non-retryable failure or an open breaker) by setting max_attempts to attempts + 1 and marking it
-- retryable: whatever the next attempt does, no further retry follows from the grant.
CREATE OR REPLACE FUNCTION stepready.retry_step_now(p_step_id bigint, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    l record;
    s stepready.steps;
    t stepready.tasks;
    n stepready.steps;
BEGIN
    SELECT * INTO l FROM stepready._lock_step_and_task(p_step_id);
    s := l.p_step;
    t := l.p_task;
    IF t.status = 'cancelled' THEN
        PERFORM stepready._refuse(format('cannot retry step %s ("%s"): task %s is cancelled', s.id, s.name, t.id));
    END IF;
    -- "Now" is after an earlier attempt that may still run has ended (an orphaned lease: _orphan_hold), and, for
    -- a first attempt, not before the task's run_at (SPEC §15: no step of the task starts before it).
    IF s.state IN ('pending', 'waiting_for_retry') THEN
        UPDATE stepready.steps
           SET next_attempt_at = GREATEST(stepready._orphan_hold(lease_expires_at, p_as_of),
                                          CASE WHEN attempts = 0 AND t.run_at > p_as_of THEN t.run_at END)
         WHERE id = s.id RETURNING * INTO n;
    ELSIF s.state = 'error' AND s.map_total IS NOT NULL THEN
        -- A map step that fanned out (SPEC §19): its failed elements are retried, not the fan-out.
        n := stepready._map_reopen(s, false, p_as_of, 'operator.retry_now');
    ELSIF s.state = 'error' THEN
        UPDATE stepready.steps
           SET state = stepready._ready_state(attempts),
               max_attempts = attempts + 1,
               retryable = true,
               next_attempt_at = stepready._orphan_hold(lease_expires_at, p_as_of)
         WHERE id = s.id
        RETURNING * INTO n;
        -- A wait step (SPEC §20) waits afresh, for a new signal or a new sleep, from p_as_of.
        IF n.wait IS NOT NULL THEN
            PERFORM stepready._log(n, 'operator.retry_now', s.state, n.state,
                stepready._operator_details(jsonb_build_object('previous_next_attempt_at', s.next_attempt_at,
                    'previous_max_attempts', s.max_attempts, 'previous_retryable', s.retryable)), p_as_of);
            PERFORM stepready._wait_enter(ARRAY[n.id], p_as_of);
            RETURN true;
        END IF;
    ELSE
        PERFORM stepready._refuse(format('cannot retry step %s ("%s"): it is %s', s.id, s.name, s.state));
    END IF;
    PERFORM stepready._log(n, 'operator.retry_now', s.state, n.state,
        stepready._operator_details(jsonb_build_object('previous_next_attempt_at', s.next_attempt_at,
            'previous_max_attempts', s.max_attempts, 'previous_retryable', s.retryable)), p_as_of);
    RETURN true;
END;
$$;

-- Marks a step resolved by hand with the given output; its dependents proceed as if it had completed. A running
-- attempt is fenced out and keeps its lease, orphaned, as cancel_task leaves it.
CREATE OR REPLACE FUNCTION stepready.resolve_step(p_step_id bigint, p_output jsonb, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    l record;
    s stepready.steps;
    t stepready.tasks;
    n stepready.steps;
BEGIN
    -- SPEC §18: the output cap holds for an operator's output too (before any lock is taken).
    PERFORM stepready._check_output_size(p_step_id, p_output);
    SELECT * INTO l FROM stepready._lock_step_and_task(p_step_id);
    s := l.p_step;
    t := l.p_task;
    IF t.status = 'cancelled' THEN
        PERFORM stepready._refuse(format('cannot resolve step %s ("%s"): task %s is cancelled', s.id, s.name, t.id));
    END IF;
    IF s.state IN ('complete', 'resolved_manually') THEN
        PERFORM stepready._refuse(format('cannot resolve step %s ("%s"): it is already %s', s.id, s.name, s.state));
    END IF;
    UPDATE stepready.steps
       SET state = 'resolved_manually', output = p_output, next_attempt_at = NULL, completed_at = p_as_of
     WHERE id = s.id
    RETURNING * INTO n;
    IF s.map_total IS NOT NULL THEN
        -- A map step (SPEC §19): its elements not yet terminal start no more (one in flight keeps its lease,
        -- orphaned, as an operator's cancel leaves it). Locked after the map step, in ascending id.
        PERFORM 1 FROM stepready.steps e WHERE e.map_step_id = s.id AND NOT stepready._is_terminal(e.state)
          ORDER BY e.id FOR UPDATE;
        WITH cancelled AS (
            UPDATE stepready.steps e
               SET state = 'cancelled', pending_parents = 0, next_attempt_at = NULL, completed_at = p_as_of
             WHERE e.map_step_id = s.id AND NOT stepready._is_terminal(e.state)
            RETURNING e.id, e.task_id, e.attempts, e.iteration,
                      (SELECT o.state FROM stepready.steps o WHERE o.id = e.id) AS from_state
        )
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT c.task_id, c.id, c.attempts, c.iteration, 'step.cancelled', c.from_state, 'cancelled',
               jsonb_build_object('reason', 'map step resolved', 'map_step_id', s.id), p_as_of
          FROM cancelled c ORDER BY c.id;
    END IF;
    PERFORM stepready._log(n, 'step.resolved', s.state, 'resolved_manually', stepready._orphan_details(s), p_as_of);
    PERFORM stepready._log(n, 'operator.resolve', s.state, 'resolved_manually',
        stepready._operator_details(jsonb_build_object('output', p_output)), p_as_of);
    RETURN true;
END;
$$;

-- Resume from failure: every error, skipped and cancelled step goes back to pending with a fresh retry budget;
-- completed steps keep their outputs, and an iterating step keeps its iteration and input. The fencing token is
-- kept (an attempt started before the reset can never pass for one started after it), and a step whose cancelled
-- attempt may still run (an orphaned lease) is not due before that attempt has ended. Returns the number of steps
-- reset.
CREATE OR REPLACE FUNCTION stepready.reset_task(p_task_id bigint, p_as_of timestamptz DEFAULT now())
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    t stepready.tasks := stepready._lock_task_and_steps(p_task_id);
    s stepready.steps;
    k int := 0;
    v_waits bigint[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM stepready.steps
                    WHERE task_id = t.id AND state IN ('error', 'skipped', 'cancelled')) THEN
        PERFORM stepready._refuse(format('cannot reset task %s (%s): it has no error, skipped or cancelled step',
                                         t.id, t.status));
    END IF;
    IF t.status = 'cancelled' THEN
        -- Lift the sticky cancelled status; the step changes below re-derive the rest.
        UPDATE stepready.tasks SET status = 'in_progress', completed_at = NULL WHERE id = t.id;
    END IF;
    FOR s IN SELECT * FROM stepready.steps WHERE task_id = t.id AND state IN ('error', 'skipped', 'cancelled')
              ORDER BY id FOR UPDATE
    LOOP
        CONTINUE WHEN s.map_step_id IS NOT NULL; -- an element: its map step's reset below reopens it
        IF s.map_total IS NOT NULL THEN
            -- A map step that fanned out (SPEC §19): back to in_progress, its elements to their first attempt.
            PERFORM stepready._map_reopen(s, true, p_as_of, 'operator.reset');
            PERFORM stepready._log(s, 'operator.reset', s.state, 'in_progress', stepready._operator_details('{}'),
                                   p_as_of);
            k := k + 1;
            CONTINUE;
        END IF;
        -- Back to its first attempt: not before the task's run_at (SPEC §15), nor before an earlier attempt that
        -- may still run has ended.
        UPDATE stepready.steps
           SET state = 'pending', attempts = 0,
               next_attempt_at = GREATEST(stepready._orphan_hold(lease_expires_at, p_as_of),
                                          CASE WHEN t.run_at > p_as_of THEN t.run_at END),
               breaker_fingerprint = NULL, breaker_count = 0
         WHERE id = s.id;
        PERFORM stepready._log(s, 'operator.reset', s.state, 'pending', stepready._operator_details('{}'), p_as_of);
        IF s.wait IS NOT NULL THEN
            v_waits := v_waits || s.id;
        END IF;
        k := k + 1;
    END LOOP;
    -- Wait steps reset (SPEC §20) wait afresh from p_as_of, those whose parents are satisfied at once: for a new
    -- signal (the one they consumed stays consumed, in the mailbox's history) or a new sleep. docs/signals.md.
    IF v_waits IS NOT NULL THEN
        PERFORM stepready._wait_enter(v_waits, p_as_of);
    END IF;
    PERFORM stepready._log_task(t.id, 'operator.reset',
        jsonb_build_object('previous_status', t.status, 'steps_reset', k), p_as_of);
    RETURN k;
END;
$$;
