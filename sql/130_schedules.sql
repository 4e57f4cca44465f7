-- Cron schedules (SPEC §15). Fire times are computed in Go (the cron library, time zones); these functions do
-- the bookkeeping so that firing is idempotent however many daemons run: a fire is a compare-and-swap on
-- next_fire_at under the schedule's row lock, and the task's idempotency key schedule:NAME:FIRE_TIME makes a
-- repeated create return the existing task.

-- The idempotency key of a fire: schedule:NAME:FIRE_TIME, the fire time in RFC 3339, UTC, whole seconds
-- (cron and @every fire on whole seconds).
CREATE OR REPLACE FUNCTION stepready.schedule_idempotency_key(p_name text, p_fire_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 'schedule:' || p_name || ':' || to_char(p_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
$$;

-- Creates schedule p_name, or with p_replace updates it (template, cron, timezone, context, overlap; paused and
-- the fire history are kept). p_next_fire_at is the first fire time computed by the caller; on an update it is
-- used only when cron or timezone changed, so re-applying the same schedule keeps its phase. Returns true when
-- the schedule is new. Without p_replace an existing name raises 23505.
CREATE OR REPLACE FUNCTION stepready.put_schedule(p_name text, p_template text, p_cron text, p_timezone text,
                                                  p_context jsonb, p_overlap text, p_next_fire_at timestamptz,
                                                  p_replace bool DEFAULT false)
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    v_old stepready.schedules;
BEGIN
    SELECT * INTO v_old FROM stepready.schedules WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO stepready.schedules (name, template, cron, timezone, context, overlap, next_fire_at)
        VALUES (p_name, p_template, p_cron, COALESCE(p_timezone, 'UTC'), COALESCE(p_context, '{}'),
                COALESCE(p_overlap, 'allow'), p_next_fire_at);
        RETURN true;
    END IF;
    IF NOT p_replace THEN
        RAISE EXCEPTION 'schedule "%" already exists', p_name USING ERRCODE = '23505';
    END IF;
    UPDATE stepready.schedules
       SET template = p_template, cron = p_cron, timezone = COALESCE(p_timezone, 'UTC'),
           context = COALESCE(p_context, '{}'), overlap = COALESCE(p_overlap, 'allow'),
           next_fire_at = CASE WHEN v_old.cron = p_cron AND v_old.timezone = COALESCE(p_timezone, 'UTC')
                                    AND v_old.next_fire_at IS NOT NULL
                               THEN v_old.next_fire_at ELSE p_next_fire_at END,
           last_error = NULL, last_error_at = NULL, updated_at = now()
     WHERE name = p_name;
    RETURN false;
END;
$$;

-- Pauses schedule p_name: it fires nothing until resumed. Unknown name: P0002.
CREATE OR REPLACE FUNCTION stepready.pause_schedule(p_name text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE stepready.schedules SET paused = true, updated_at = now() WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schedule "%" does not exist', p_name USING ERRCODE = 'P0002';
    END IF;
END;
$$;

-- Resumes schedule p_name with its next fire time p_next_fire_at (computed by the caller from now: the fire
-- times that passed while it was paused do not fire). Unknown name: P0002.
CREATE OR REPLACE FUNCTION stepready.resume_schedule(p_name text, p_next_fire_at timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE stepready.schedules
       SET paused = false, next_fire_at = CASE WHEN paused THEN p_next_fire_at ELSE next_fire_at END,
           updated_at = now()
     WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schedule "%" does not exist', p_name USING ERRCODE = 'P0002';
    END IF;
END;
$$;

-- Deletes schedule p_name (its tasks stay). Unknown name: P0002.
CREATE OR REPLACE FUNCTION stepready.delete_schedule(p_name text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM stepready.schedules WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schedule "%" does not exist', p_name USING ERRCODE = 'P0002';
    END IF;
END;
$$;

-- The unpaused schedules the leader must handle at p_as_of, most overdue first: due ones (next_fire_at <=
-- p_as_of), and ones without a next fire time (inserted by plain SQL). A schedule whose last attempt failed
-- waits p_error_retry_ms after it before the next one.
CREATE OR REPLACE FUNCTION stepready.due_schedules(p_as_of timestamptz DEFAULT now(),
                                                   p_error_retry_ms bigint DEFAULT 5000, p_limit int DEFAULT 100)
RETURNS SETOF stepready.schedules
LANGUAGE sql STABLE
AS $$
    SELECT *
      FROM stepready.schedules s
     WHERE NOT s.paused
       AND (s.next_fire_at IS NULL OR s.next_fire_at <= p_as_of)
       AND (s.last_error_at IS NULL OR s.last_error_at + make_interval(secs => p_error_retry_ms / 1000.0) <= p_as_of)
     ORDER BY s.next_fire_at NULLS FIRST, s.name
     LIMIT p_limit;
$$;

-- When the leader should look again: the earliest moment a schedule becomes due (NULL: none is waiting).
CREATE OR REPLACE FUNCTION stepready.next_schedule_wake(p_as_of timestamptz DEFAULT now(),
                                                        p_error_retry_ms bigint DEFAULT 5000)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT min(GREATEST(COALESCE(s.next_fire_at, p_as_of),
                        s.last_error_at + make_interval(secs => p_error_retry_ms / 1000.0)))
      FROM stepready.schedules s
     WHERE NOT s.paused;
$$;

-- Records that handling schedule p_name failed (for example its cron or time zone does not parse): shown by
-- `schedule list`, retried p_error_retry_ms later. Its next fire time is kept.
CREATE OR REPLACE FUNCTION stepready.schedule_failed(p_name text, p_error text, p_as_of timestamptz DEFAULT now())
RETURNS void
LANGUAGE sql
AS $$
    UPDATE stepready.schedules SET last_error = p_error, last_error_at = p_as_of WHERE name = p_name;
$$;

-- Sets the first fire time of a schedule that has none (compare-and-swap on the NULL): true when it was set.
CREATE OR REPLACE FUNCTION stepready.set_schedule_next_fire(p_name text, p_next_fire_at timestamptz)
RETURNS bool
LANGUAGE sql
AS $$
    WITH u AS (
        UPDATE stepready.schedules SET next_fire_at = p_next_fire_at, last_error = NULL, last_error_at = NULL
         WHERE name = p_name AND next_fire_at IS NULL AND NOT paused
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM u);
$$;

-- Fires schedule p_name once, for fire time p_fire_at, provided its next_fire_at is still p_expected (the value
-- the caller computed p_fire_at from; another leader that got there first has moved it on: 'stale', nothing
-- done). p_fire_at is the latest fire time <= p_as_of (fire times missed while no daemon ran do not fire) and
-- p_next_fire_at the one after it. Outcomes:
--   fired    a task was created from the template with idempotency key schedule:NAME:FIRE_TIME (or that task
--            already existed), last_fired_at/last_task_id/next_fire_at advanced, last_error cleared
--   skipped  overlap = 'skip' and the previous task (last_task_id) is not terminal: no task; last_skipped_at
--            and skipped_count record it, next_fire_at advances
--   failed   creating the task raised (template missing or invalid): last_error/last_error_at record it,
--            next_fire_at is kept so the schedule fires as soon as the template is fixed (retried after
--            due_schedules' p_error_retry_ms)
--   stale    next_fire_at is no longer p_expected, or the schedule is paused or gone: nothing done
CREATE OR REPLACE FUNCTION stepready.fire_schedule(p_name text, p_expected timestamptz, p_fire_at timestamptz,
                                                   p_next_fire_at timestamptz, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (outcome text, task_id bigint, error text)
LANGUAGE plpgsql
AS $$
DECLARE
    v_s      stepready.schedules;
    v_status text;
    v_id     bigint;
BEGIN
    SELECT * INTO v_s FROM stepready.schedules s WHERE s.name = p_name FOR UPDATE;
    IF NOT FOUND OR v_s.paused OR v_s.next_fire_at IS DISTINCT FROM p_expected THEN
        RETURN QUERY SELECT 'stale'::text, NULL::bigint, NULL::text;
        RETURN;
    END IF;
    IF v_s.overlap = 'skip' AND v_s.last_task_id IS NOT NULL THEN
        SELECT t.status INTO v_status FROM stepready.tasks t WHERE t.id = v_s.last_task_id;
        -- A task that is gone (pruned) is over.
        IF FOUND AND v_status NOT IN ('complete', 'error', 'cancelled') THEN
            UPDATE stepready.schedules s
               SET next_fire_at = p_next_fire_at, last_skipped_at = p_fire_at, skipped_count = s.skipped_count + 1,
                   last_error = NULL, last_error_at = NULL, updated_at = p_as_of
             WHERE s.name = p_name;
            RETURN QUERY SELECT 'skipped'::text, v_s.last_task_id, NULL::text;
            RETURN;
        END IF;
    END IF;
    BEGIN
        v_id := stepready.create_task_from_template(v_s.template, v_s.context,
                                                    stepready.schedule_idempotency_key(p_name, p_fire_at));
    EXCEPTION WHEN OTHERS THEN
        UPDATE stepready.schedules s
           SET last_error = format('template "%s": %s', v_s.template, SQLERRM), last_error_at = p_as_of
         WHERE s.name = p_name;
        RETURN QUERY SELECT 'failed'::text, NULL::bigint, format('template "%s": %s', v_s.template, SQLERRM);
        RETURN;
    END;
    UPDATE stepready.schedules s
       SET next_fire_at = p_next_fire_at, last_fired_at = p_fire_at, last_task_id = v_id,
           last_error = NULL, last_error_at = NULL, updated_at = p_as_of
     WHERE s.name = p_name;
    RETURN QUERY SELECT 'fired'::text, v_id, NULL::text;
END;
$$;
