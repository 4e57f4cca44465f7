-- Task status (SPEC §7) and the step bookkeeping that follows state changes. Status is derived from three
-- counters kept on the task row, updated in the same transaction as the step change, so completing the last
-- step of a large task costs O(1) and two concurrent completions serialize on the task row instead of each
-- missing the other's commit.

-- The status a task has given its counters. `cancelled` is sticky (only reset_task clears it); a step in error
-- makes the task `error`; every step satisfied makes it `complete`; leaving error/complete goes back to
-- `in_progress`; a pending task starts when one of its steps is claimed.
CREATE OR REPLACE FUNCTION stepready._derive_task_status(p_status text, p_total int, p_unsatisfied int,
                                                         p_in_error int, p_started bool)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_status = 'cancelled' THEN 'cancelled'
        WHEN p_in_error > 0 THEN 'error'
        WHEN p_total > 0 AND p_unsatisfied = 0 THEN 'complete'
        WHEN p_status IN ('error', 'complete') THEN 'in_progress'
        WHEN p_status = 'pending' AND p_started THEN 'in_progress'
        ELSE p_status
    END;
$$;

-- Applies counter deltas to tasks (parallel arrays, one entry per task) and re-derives their status. p_at stamps
-- completed_at. Rows are locked in ascending task id (see "Lock order" in docs/design-core.md).
CREATE OR REPLACE FUNCTION stepready._task_apply(p_task_ids bigint[], p_d_total int[], p_d_unsatisfied int[],
                                                 p_d_in_error int[], p_started bool[], p_at timestamptz[])
RETURNS void
LANGUAGE plpgsql -- not sql: PL/pgSQL caches the plan, a SQL function would plan it on every call
AS $$
BEGIN
    WITH d AS (
        SELECT u.task_id, u.d_total, u.d_unsat, u.d_err, u.started, u.at
          FROM unnest(p_task_ids, p_d_total, p_d_unsatisfied, p_d_in_error, p_started, p_at)
               AS u(task_id, d_total, d_unsat, d_err, started, at)
    ), locked AS (
        SELECT t.id FROM stepready.tasks t WHERE t.id IN (SELECT task_id FROM d) ORDER BY t.id FOR NO KEY UPDATE
    )
    UPDATE stepready.tasks t
       SET steps_total       = t.steps_total + d.d_total,
           steps_unsatisfied = t.steps_unsatisfied + d.d_unsat,
           steps_in_error    = t.steps_in_error + d.d_err,
           status            = stepready._derive_task_status(t.status, t.steps_total + d.d_total,
                                   t.steps_unsatisfied + d.d_unsat, t.steps_in_error + d.d_err, d.started),
           completed_at      = CASE
               WHEN stepready._derive_task_status(t.status, t.steps_total + d.d_total,
                        t.steps_unsatisfied + d.d_unsat, t.steps_in_error + d.d_err, d.started) = 'complete'
               THEN COALESCE(t.completed_at, d.at, now())
           END
      FROM d JOIN locked l ON l.id = d.task_id
     WHERE t.id = d.task_id;
END;
$$;

-- A state change of one step: adjust its task's counters (or, for a claim, just start a pending task).
CREATE OR REPLACE FUNCTION stepready._steps_track_task()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_d_unsat int := (NOT stepready._satisfies(NEW.state))::int - (NOT stepready._satisfies(OLD.state))::int;
    v_d_err   int := (NEW.state = 'error')::int - (OLD.state = 'error')::int;
    v_started bool := NEW.state IN ('enqueued', 'in_progress');
BEGIN
    IF v_d_unsat = 0 AND v_d_err = 0 THEN
        IF v_started THEN
            -- A claim: only a pending task changes, and claim_ready_steps has normally started it already.
            UPDATE stepready.tasks SET status = 'in_progress' WHERE id = NEW.task_id AND status = 'pending';
        END IF;
    ELSE
        PERFORM stepready._task_apply(ARRAY[NEW.task_id], ARRAY[0], ARRAY[v_d_unsat], ARRAY[v_d_err],
                                      ARRAY[v_started], ARRAY[NEW.completed_at]);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER steps_track_task_update
    AFTER UPDATE OF state ON stepready.steps
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION stepready._steps_track_task();

-- Inserted and deleted steps are counted once per statement, so defining a task of N steps updates its row
-- once, not N times (N updates of one row in one transaction cost O(N²)).
CREATE OR REPLACE FUNCTION stepready._steps_count_rows()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids bigint[]; v_total int[]; v_unsat int[]; v_err int[]; v_started bool[]; v_at timestamptz[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(task_id), array_agg(total), array_agg(unsat), array_agg(err), array_agg(started),
               array_agg(at)
          INTO v_ids, v_total, v_unsat, v_err, v_started, v_at
          FROM (SELECT task_id, count(*)::int AS total,
                       (count(*) FILTER (WHERE NOT stepready._satisfies(state)))::int AS unsat,
                       (count(*) FILTER (WHERE state = 'error'))::int AS err,
                       bool_or(state IN ('enqueued', 'in_progress')) AS started, max(completed_at) AS at
                  FROM changed_rows GROUP BY task_id) c;
    ELSE
        SELECT array_agg(task_id), array_agg(-total), array_agg(-unsat), array_agg(-err), array_agg(false),
               array_agg(NULL::timestamptz)
          INTO v_ids, v_total, v_unsat, v_err, v_started, v_at
          FROM (SELECT task_id, count(*)::int AS total,
                       (count(*) FILTER (WHERE NOT stepready._satisfies(state)))::int AS unsat,
                       (count(*) FILTER (WHERE state = 'error'))::int AS err
                  FROM changed_rows GROUP BY task_id) c;
    END IF;
    IF v_ids IS NOT NULL THEN
        PERFORM stepready._task_apply(v_ids, v_total, v_unsat, v_err, v_started, v_at);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER steps_count_inserted
    AFTER INSERT ON stepready.steps
    REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._steps_count_rows();

CREATE OR REPLACE TRIGGER steps_count_deleted
    AFTER DELETE ON stepready.steps
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._steps_count_rows();

-- Bookkeeping on every step update: updated_at, completed_at, leases outside flight, and task_held for a step
-- that (re)enters a claimable state.
CREATE OR REPLACE FUNCTION stepready._steps_before_update()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at THEN
        NEW.updated_at := now();
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NEW.state IN ('pending', 'waiting_for_retry') AND OLD.state NOT IN ('pending', 'waiting_for_retry') THEN
            SELECT t.paused OR t.status NOT IN ('pending', 'in_progress') INTO NEW.task_held
              FROM stepready.tasks t WHERE t.id = NEW.task_id;
        END IF;
        IF stepready._is_terminal(NEW.state) THEN
            IF NOT stepready._is_terminal(OLD.state) AND NEW.completed_at IS NOT DISTINCT FROM OLD.completed_at THEN
                NEW.completed_at := now();
            END IF;
        ELSE
            NEW.completed_at := NULL;
        END IF;
        IF NEW.state NOT IN ('enqueued', 'in_progress') THEN
            NEW.lease_owner := NULL;
            NEW.lease_expires_at := NULL;
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER steps_before_update
    BEFORE UPDATE ON stepready.steps
    FOR EACH ROW EXECUTE FUNCTION stepready._steps_before_update();

CREATE OR REPLACE FUNCTION stepready._tasks_before_update()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER tasks_before_update
    BEFORE UPDATE ON stepready.tasks
    FOR EACH ROW EXECUTE FUNCTION stepready._tasks_before_update();

-- A task that stops or starts being runnable (paused, error, cancelled, complete) moves its claimable steps out
-- of or back into the claim index.
CREATE OR REPLACE FUNCTION stepready._tasks_propagate_hold()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_held bool := NEW.paused OR NEW.status NOT IN ('pending', 'in_progress');
BEGIN
    IF v_held IS DISTINCT FROM (OLD.paused OR OLD.status NOT IN ('pending', 'in_progress')) THEN
        UPDATE stepready.steps SET task_held = v_held
         WHERE task_id = NEW.id AND state IN ('pending', 'waiting_for_retry') AND task_held IS DISTINCT FROM v_held;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER tasks_propagate_hold
    AFTER UPDATE OF status, paused ON stepready.tasks
    FOR EACH ROW EXECUTE FUNCTION stepready._tasks_propagate_hold();
