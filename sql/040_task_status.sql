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

-- tasks.completed_at for a task going from p_old to p_new (SPEC §13): the time it reached a terminal status
-- (complete, error, cancelled), kept while it stays in that status, NULL when it is not terminal (reopened).
-- p_at is the time of the step change that made it terminal, when known.
CREATE OR REPLACE FUNCTION stepready._task_completed_at(p_old text, p_completed_at timestamptz, p_new text,
                                                        p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_new NOT IN ('complete', 'error', 'cancelled') THEN NULL
        WHEN p_new = p_old THEN COALESCE(p_completed_at, p_at, now())
        ELSE COALESCE(p_at, now())
    END;
$$;

-- Applies counter deltas to tasks (parallel arrays, one entry per task) and re-derives their status. p_at stamps
-- completed_at. Rows are locked in ascending task id (see "Lock order" in docs/design-core.md).
CREATE OR REPLACE FUNCTION stepready._task_apply(p_task_ids bigint[], p_d_total int[], p_d_unsatisfied int[],
                                                 p_d_in_error int[], p_started bool[], p_at timestamptz[])
RETURNS void
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
-- The generic plan must be the nested loop over the primary key whatever the statistics say: on a never analyzed
-- tasks table it was a sequential scan of every task, once per statement that adds steps.
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    -- One update joined to the deltas by id (each task appears once in p_task_ids: the callers aggregate per
    -- task). The deltas are sorted and drive a nested loop over the primary key (the generic plan), so the rows
    -- are locked in ascending id as they are updated, without a separate locking pass.
    UPDATE stepready.tasks t
       SET steps_total       = t.steps_total + d.d_total,
           steps_unsatisfied = t.steps_unsatisfied + d.d_unsat,
           steps_in_error    = t.steps_in_error + d.d_err,
           updated_at        = now(),
           status            = stepready._derive_task_status(t.status, t.steps_total + d.d_total,
                                   t.steps_unsatisfied + d.d_unsat, t.steps_in_error + d.d_err, d.started),
           -- Set when the task reaches a terminal status (SPEC §13), kept while it stays in it, cleared when
           -- it is reopened.
           completed_at      = stepready._task_completed_at(t.status, t.completed_at,
                                   stepready._derive_task_status(t.status, t.steps_total + d.d_total,
                                       t.steps_unsatisfied + d.d_unsat, t.steps_in_error + d.d_err, d.started),
                                   d.at)
      FROM (SELECT x.* FROM unnest(p_task_ids, p_d_total, p_d_unsatisfied, p_d_in_error, p_started, p_at)
                 AS x(task_id, d_total, d_unsat, d_err, started, at) ORDER BY x.task_id) AS d
     WHERE t.id = d.task_id;
END;
$$;

-- The row triggers of earlier versions, replaced by the statement trigger below.
DROP TRIGGER IF EXISTS steps_track_task_update ON stepready.steps;
DROP FUNCTION IF EXISTS stepready._steps_track_task();

-- Everything that follows an UPDATE of steps, once per statement over its transition tables (a batch of N steps
-- costs a few statements, not a few per row), in lock order: steps before tasks, ascending id within a kind.
--   1. Children of the steps whose state crossed the satisfied boundary get the summed -1/+1 in pending_parents
--      (locked in id order).
--   2. Tasks of the steps whose state changed get their counter deltas and a re-derived status (ascending task
--      id); a claim of a step of a pending task makes the task in_progress.
--   3. Each task with a step that became claimable and due now is notified once (sql/045_notify.sql).
-- The two transition tables are never joined: PL/pgSQL caches the plan made for the first (often one-row)
-- statement, and a cached nested-loop join of them would cost O(N²) on a large batch. Each table contributes its
-- own terms instead (new row +, old row −), summed per step (a row whose state did not change sums to zero),
-- then per task, in one statement. Every follow-up statement on steps runs only when it has rows to change: an
-- empty UPDATE of steps would fire this trigger again.
CREATE OR REPLACE FUNCTION stepready._steps_after_update()
RETURNS trigger
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_crossed   bigint[];
    v_cross_d   int[];
    v_tasks     bigint[];
    v_unsat     int[];
    v_err       int[];
    v_started   bool[];
    v_at        timestamptz[];
    v_notify    bigint[];
    v_children  bigint[];
    v_child_d   int[];
    v_maps      bigint[];
    v_map_done  int[];
    v_map_failed int[];
    v_map_err   jsonb[];
    v_waits     bigint[];
    v_ready     bigint[];
BEGIN
    WITH per_step AS (
        SELECT r.id, r.task_id, sum(r.unsat)::int AS unsat, sum(r.err)::int AS err,
               -- entered a started state (the old row is not started): a claim
               sum(r.started) > 0 AS started, max(r.at) AS at, sum(r.claimable) > 0 AS claimable,
               bool_or(r.element) AS element
          FROM (SELECT n.id, n.task_id, n.map_step_id IS NOT NULL AS element,
                       (NOT stepready._satisfies(n.state))::int AS unsat,
                       (n.state = 'error')::int AS err,
                       -- a claim, or a wait step starting to wait (SPEC §20: its task is running)
                       (n.state IN ('enqueued', 'in_progress', 'waiting'))::int AS started,
                       n.completed_at AS at,
                       -- a wait step is never claimable (SPEC §20): its `pending` instant is not announced
                       (n.wait IS NULL
                        AND stepready._claimable_now(n.state, n.pending_parents, n.task_held, n.next_attempt_at))::int
                           AS claimable
                  FROM new_rows n
                UNION ALL
                SELECT o.id, o.task_id, o.map_step_id IS NOT NULL,
                       -(NOT stepready._satisfies(o.state))::int, -(o.state = 'error')::int,
                       -(o.state IN ('enqueued', 'in_progress', 'waiting'))::int, NULL,
                       -(o.wait IS NULL
                         AND stepready._claimable_now(o.state, o.pending_parents, o.task_held, o.next_attempt_at))::int
                  FROM old_rows o) r
         GROUP BY r.id, r.task_id
    ), per_task AS (
        SELECT p.task_id, sum(p.unsat)::int AS unsat, sum(p.err)::int AS err, bool_or(p.started) AS started,
               max(p.at) AS at
          FROM per_step p
         -- The elements of a map step are not counted in their task (SPEC §19): the map step stands for them.
         WHERE NOT p.element
         GROUP BY p.task_id
        HAVING sum(p.unsat) <> 0 OR sum(p.err) <> 0 OR bool_or(p.started)
    )
    SELECT (SELECT array_agg(p.id ORDER BY p.id) FROM per_step p WHERE p.unsat <> 0),
           (SELECT array_agg(p.unsat ORDER BY p.id) FROM per_step p WHERE p.unsat <> 0),
           (SELECT array_agg(DISTINCT p.task_id) FROM per_step p WHERE p.claimable),
           t.tasks, t.unsat, t.err, t.started, t.at
      INTO v_crossed, v_cross_d, v_notify, v_tasks, v_unsat, v_err, v_started, v_at
      FROM (SELECT array_agg(k.task_id ORDER BY k.task_id) AS tasks, array_agg(k.unsat ORDER BY k.task_id) AS unsat,
                   array_agg(k.err ORDER BY k.task_id) AS err, array_agg(k.started ORDER BY k.task_id) AS started,
                   array_agg(k.at ORDER BY k.task_id) AS at
              FROM per_task k) t;

    IF v_crossed IS NOT NULL THEN
        SELECT array_agg(c.id ORDER BY c.id), array_agg(c.delta ORDER BY c.id)
          INTO v_children, v_child_d
          FROM (SELECT e.child_step_id AS id, sum(p.delta)::int AS delta
                  FROM unnest(v_crossed, v_cross_d) AS p(id, delta)
                  JOIN stepready.step_edges e ON e.parent_step_id = p.id
                 GROUP BY e.child_step_id
                HAVING sum(p.delta) <> 0) c;
        IF v_children IS NOT NULL THEN
            PERFORM 1 FROM stepready.steps c WHERE c.id = ANY (v_children) ORDER BY c.id FOR UPDATE;
            -- The state does not change: setting updated_at is all the bookkeeping there is (no row trigger call).
            -- Nor is there any for this trigger to do on the children's update but the wake-up of those that became
            -- claimable (no state, error count, map count or concurrency slot changes), so this pass does it from
            -- the RETURNING and the flag stepready.counting_down keeps the trigger from firing a second pass for
            -- the update (it cost as much as the first: a completion, or a signal, is a batch of one). Set just for
            -- this statement: the flag is read when the statement queues its trigger, at its end, so it is cleared
            -- in a statement of its own after it. A claimable child was not claimable before (pending_parents was
            -- > 0 unless the counter was already wrong, and then the wake-up is only spurious: a hint).
            -- Wait steps whose last parent just became satisfied (SPEC §20) start waiting below, in an update that
            -- does fire the trigger.
            PERFORM pg_catalog.set_config('stepready.counting_down', 'on', true);
            WITH u AS (
                UPDATE stepready.steps s
                   SET pending_parents = GREATEST(s.pending_parents + d.delta, 0),
                       updated_at = now()
                  FROM unnest(v_children, v_child_d) AS d(id, delta)
                 WHERE s.id = d.id
                RETURNING s.id, s.task_id, s.wait IS NOT NULL AND s.pending_parents = 0
                          AND s.state IN ('pending', 'waiting_for_retry') AS starts_waiting,
                          s.wait IS NULL AND d.delta < 0
                          AND stepready._claimable_now(s.state, s.pending_parents, s.task_held, s.next_attempt_at)
                          AS ready
            )
            SELECT array_agg(u.id ORDER BY u.id) FILTER (WHERE u.starts_waiting),
                   array_agg(DISTINCT u.task_id) FILTER (WHERE u.ready)
              INTO v_waits, v_ready
              FROM u;
            PERFORM pg_catalog.set_config('stepready.counting_down', '', true);
            v_notify := v_notify || v_ready; -- _notify_ready notifies each task once
            IF v_waits IS NOT NULL THEN
                -- As of the parents' completion (their p_as_of, kept in completed_at), so a wait's deadline
                -- follows the time the caller pinned.
                PERFORM stepready._wait_enter(v_waits,
                    (SELECT max(n.completed_at) FROM new_rows n WHERE stepready._satisfies(n.state)));
            END IF;
        END IF;
    END IF;

    IF v_tasks IS NOT NULL THEN
        -- As _task_apply (no step added or removed here): the sorted deltas drive a nested loop over the primary
        -- key, so the rows are locked in ascending id. A claim changes no counter: only a task still pending has
        -- something to do, and a task that is not is neither updated nor locked (status pending never comes back
        -- once left).
        UPDATE stepready.tasks t
           SET steps_unsatisfied = t.steps_unsatisfied + d.d_unsat,
               steps_in_error    = t.steps_in_error + d.d_err,
               updated_at        = now(),
               status            = stepready._derive_task_status(t.status, t.steps_total,
                                       t.steps_unsatisfied + d.d_unsat, t.steps_in_error + d.d_err, d.started),
               completed_at      = stepready._task_completed_at(t.status, t.completed_at,
                                       stepready._derive_task_status(t.status, t.steps_total,
                                           t.steps_unsatisfied + d.d_unsat, t.steps_in_error + d.d_err, d.started),
                                       d.at)
          FROM (SELECT x.* FROM unnest(v_tasks, v_unsat, v_err, v_started, v_at)
                     AS x(task_id, d_unsat, d_err, started, at) ORDER BY x.task_id) AS d
         WHERE t.id = d.task_id
           AND (d.d_unsat <> 0 OR d.d_err <> 0 OR (d.started AND t.status = 'pending'));
    END IF;

    IF v_notify IS NOT NULL THEN
        PERFORM stepready._notify_ready(v_notify);
    END IF;
    -- Elements of map steps that entered or left complete/resolved_manually or error (SPEC §19): their map
    -- steps' counts, the aggregate, the end of a map whose element failed (sql/058_map.sql).
    IF EXISTS (SELECT 1 FROM new_rows n WHERE n.map_step_id IS NOT NULL) THEN
        SELECT array_agg(m.map_id ORDER BY m.map_id), array_agg(m.done ORDER BY m.map_id),
               array_agg(m.failed ORDER BY m.map_id), array_agg(m.err ORDER BY m.map_id)
          INTO v_maps, v_map_done, v_map_failed, v_map_err
          FROM (SELECT x.map_id, sum(x.done)::int AS done, sum(x.failed)::int AS failed,
                       (array_agg(x.err ORDER BY x.idx) FILTER (WHERE x.err IS NOT NULL))[1] AS err
                  FROM (SELECT n.map_step_id AS map_id, n.element_index AS idx,
                               (n.state IN ('complete', 'resolved_manually'))::int AS done,
                               (n.state = 'error')::int AS failed,
                               CASE WHEN n.state = 'error' THEN jsonb_build_object(
                                   'class', n.last_error ->> 'class',
                                   'message', format('element %s ("%s") failed: %s', n.element_index, n.name,
                                                     COALESCE(n.last_error ->> 'message', 'error'))) END AS err
                          FROM new_rows n WHERE n.map_step_id IS NOT NULL
                        UNION ALL
                        SELECT o.map_step_id, o.element_index, -(o.state IN ('complete', 'resolved_manually'))::int,
                               -(o.state = 'error')::int, NULL
                          FROM old_rows o WHERE o.map_step_id IS NOT NULL) x
                 GROUP BY x.map_id
                HAVING sum(x.done) <> 0 OR sum(x.failed) <> 0) m;
        IF v_maps IS NOT NULL THEN
            PERFORM stepready._map_after_elements(v_maps, v_map_done, v_map_failed, v_map_err);
        END IF;
    END IF;
    -- A step that stops holding a slot of its concurrency key (SPEC §14; stepready._holds_slot: it leaves flight
    -- with its lease, or its orphaned lease ends) frees it: steps of that key that the last claim left behind
    -- for want of a slot (flow_state.is_full) are claimable again, though no row of theirs changed. (An orphaned
    -- lease that runs out by time alone changes no row: the reaper's clearing of it notifies.)
    IF EXISTS (SELECT 1 FROM old_rows o WHERE o.concurrency_key IS NOT NULL
                  AND (o.state IN ('enqueued', 'in_progress') OR o.lease_expires_at IS NOT NULL))
    THEN
        SELECT array_agg(DISTINCT n.task_id) INTO v_notify
          FROM old_rows o
          JOIN new_rows n ON n.id = o.id
         WHERE o.concurrency_key IS NOT NULL AND (o.state IN ('enqueued', 'in_progress') OR o.lease_expires_at IS NOT NULL)
           AND n.state NOT IN ('enqueued', 'in_progress') AND n.lease_expires_at IS NULL
           AND EXISTS (SELECT 1 FROM stepready.flow_state f WHERE f.key = o.concurrency_key AND f.is_full);
        IF v_notify IS NOT NULL THEN
            PERFORM stepready._notify_ready(v_notify);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- Not fired for the children's update of _steps_after_update itself, which does that update's bookkeeping (the
-- flag is set by it for that one statement).
CREATE OR REPLACE TRIGGER steps_after_update
    AFTER UPDATE ON stepready.steps
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT
    WHEN (pg_catalog.current_setting('stepready.counting_down', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION stepready._steps_after_update();

-- Inserted and deleted steps are counted once per statement, so defining a task of N steps updates its row
-- once, not N times (N updates of one row in one transaction cost O(N²)). The elements of map steps are not
-- counted (their map step stands for them: sql/058_map.sql).
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
                  FROM changed_rows WHERE map_step_id IS NULL GROUP BY task_id) c;
    ELSE
        SELECT array_agg(task_id), array_agg(-total), array_agg(-unsat), array_agg(-err), array_agg(false),
               array_agg(NULL::timestamptz)
          INTO v_ids, v_total, v_unsat, v_err, v_started, v_at
          FROM (SELECT task_id, count(*)::int AS total,
                       (count(*) FILTER (WHERE NOT stepready._satisfies(state)))::int AS unsat,
                       (count(*) FILTER (WHERE state = 'error'))::int AS err
                  FROM changed_rows WHERE map_step_id IS NULL GROUP BY task_id) c;
    END IF;
    IF v_ids IS NOT NULL THEN
        PERFORM stepready._task_apply(v_ids, v_total, v_unsat, v_err, v_started, v_at);
    END IF;
    RETURN NULL;
END;
$$;

-- create_tasks writes its tasks with their counters already set (sql/018_validated_write.sql).
DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE OR REPLACE TRIGGER steps_count_inserted
    AFTER INSERT ON stepready.steps
    REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT WHEN (NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._steps_count_rows()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;

CREATE OR REPLACE TRIGGER steps_count_deleted
    AFTER DELETE ON stepready.steps
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._steps_count_rows();

-- Bookkeeping on every step update: updated_at, completed_at, the lease of a claim that leaves flight unstarted,
-- the fencing token, and task_held and task_priority for a step that (re)enters a claimable state.
CREATE OR REPLACE FUNCTION stepready._steps_before_update()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at THEN
        NEW.updated_at := now();
    END IF;
    -- The fencing token never goes down and never falls below the attempt count: an update that sets attempts
    -- itself (a fixture, a repair by hand) moves it along, so such an attempt is fenced by its number.
    NEW.fence_token := GREATEST(NEW.fence_token, OLD.fence_token, NEW.attempts);
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NEW.state IN ('pending', 'waiting_for_retry') AND OLD.state NOT IN ('pending', 'waiting_for_retry') THEN
            SELECT t.paused OR t.status NOT IN ('pending', 'in_progress'), t.priority
              INTO NEW.task_held, NEW.task_priority
              FROM stepready.tasks t WHERE t.id = NEW.task_id;
        END IF;
        IF stepready._is_terminal(NEW.state) THEN
            IF NOT stepready._is_terminal(OLD.state) AND NEW.completed_at IS NOT DISTINCT FROM OLD.completed_at THEN
                NEW.completed_at := now();
            END IF;
        ELSE
            NEW.completed_at := NULL;
        END IF;
        -- A claim that leaves flight unstarted (enqueued) has nothing running: its lease ends with it. The lease of a
        -- started attempt is ended only by the calls that end the attempt (complete, fail, continue, release,
        -- the reaper: they clear it themselves) or by its expiry. An operator that moves a running step out of
        -- flight (cancel_task, resolve_step) leaves it, orphaned: the handler may still run, and the step keeps
        -- its concurrency slot until the old worker reports or the lease expires (docs/design-core.md).
        IF OLD.state = 'enqueued' AND NEW.state NOT IN ('enqueued', 'in_progress') THEN
            NEW.lease_owner := NULL;
            NEW.lease_expires_at := NULL;
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

-- The WHEN clause calls the function only for a row that needs some of its work: the update left updated_at
-- alone, lowered the fencing token below what it was or below the attempt count, or changed the state without
-- doing the rest itself (completed_at out of step with the state; a lease left on a claim that leaves flight
-- unstarted). An update that sets updated_at takes on the rest of the bookkeeping: the hot-path functions
-- (claims, starts, completions, failures) set updated_at, completed_at, the lease and the token, and task_held
-- and task_priority for a step entering a claimable state, in their own UPDATE, so a batch of them costs no
-- PL/pgSQL call per row.
CREATE OR REPLACE TRIGGER steps_before_update
    BEFORE UPDATE ON stepready.steps
    FOR EACH ROW
    WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at
          OR NEW.fence_token < OLD.fence_token OR NEW.fence_token < NEW.attempts
          OR (NEW.state IS DISTINCT FROM OLD.state
              AND ((NEW.state IN ('complete', 'error', 'skipped', 'cancelled', 'resolved_manually'))
                      IS DISTINCT FROM (NEW.completed_at IS NOT NULL)
                   OR (OLD.state = 'enqueued' AND NEW.state NOT IN ('enqueued', 'in_progress')
                       AND (NEW.lease_owner IS NOT NULL OR NEW.lease_expires_at IS NOT NULL)))))
    EXECUTE FUNCTION stepready._steps_before_update();

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

-- The WHEN clause spares the function call when the update already set updated_at (_task_apply does).
CREATE OR REPLACE TRIGGER tasks_before_update
    BEFORE UPDATE ON stepready.tasks
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION stepready._tasks_before_update();

-- A task that stops or starts being runnable (paused, error, cancelled) moves its claimable steps out of or back
-- into the claim index. A task becoming complete has no claimable step (every step satisfies its dependents), so
-- the WHEN clause of the trigger skips it, as it skips every update that leaves the hold unchanged.
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
    FOR EACH ROW
    WHEN ((OLD.paused OR OLD.status NOT IN ('pending', 'in_progress'))
              IS DISTINCT FROM (NEW.paused OR NEW.status NOT IN ('pending', 'in_progress'))
          AND NEW.status <> 'complete')
    EXECUTE FUNCTION stepready._tasks_propagate_hold();

-- A task's priority is copied onto its claimable steps (steps.task_priority orders the claim index). Steps in
-- flight or finished are left alone: a step re-entering a claimable state reads it again (_steps_before_update).
CREATE OR REPLACE FUNCTION stepready._tasks_propagate_priority()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE stepready.steps SET task_priority = NEW.priority
     WHERE task_id = NEW.id AND state IN ('pending', 'waiting_for_retry') AND task_priority <> NEW.priority;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER tasks_propagate_priority
    AFTER UPDATE OF priority ON stepready.tasks
    FOR EACH ROW WHEN (OLD.priority IS DISTINCT FROM NEW.priority)
    EXECUTE FUNCTION stepready._tasks_propagate_priority();
