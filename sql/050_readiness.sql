-- Readiness: whether each step may start at p_as_of, and why not. These functions read the truth (parent rows,
-- task row); the claim path uses the trigger-maintained pending_parents counter, which the boundary tests hold
-- equal to what step_readiness computes here.

-- The one list of the reasons a step may not start, in precedence order (issue 26: the docs, the CLI and explain
-- each had a list of their own, with different members and ranks). step_readiness reports the first reason that
-- applies (_blocked_reason's CASE, then flow control, in this order: TestReadinessReasonsPrecedence walks one step
-- through all of them); explain takes its ranks from here; the docs' table is generated from it (tests/docs
-- TestReasonLists). A new reason is added here first, at its rank. The last, waiting_for_worker, is explain's
-- row for a ready step (work routing: the queue and handler it waits for); step_readiness never reports it.
CREATE OR REPLACE FUNCTION stepready.readiness_reasons()
RETURNS TABLE (rank int, reason text, meaning text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT v.rank, v.reason, v.meaning FROM (VALUES
        (1, 'task_not_active', 'its task is not `pending` or `in_progress`: it is `complete`, `error` or `cancelled`'),
        (2, 'task_paused', 'its task is paused'),
        (3, 'scheduled', 'its task''s `run_at` is still to come: no step of the task starts before it'),
        (4, 'terminal', 'it is finished: `complete`, `error`, `skipped`, `cancelled` or `resolved_manually`'),
        (5, 'in_flight', 'it is `enqueued` or `in_progress`, or an earlier attempt of it still holds an orphaned lease'),
        (6, 'waiting_for_signal', 'it is a wait step, `waiting` for a signal of its name (until its timeout, if it has one)'),
        (7, 'sleeping', 'it is a wait step, `waiting` for its time to come (`duration_ms` or `until`)'),
        (8, 'waiting_for_dependencies', 'a parent does not satisfy the dependency (it is not `complete`, `resolved_manually` or `skipped`)'),
        (9, 'map_window', 'it is an element of a map step that has its `max_in_flight` elements in flight: it starts when one of them ends, in element order'),
        (10, 'not_retryable', 'it is not retryable and has had its attempt'),
        (11, 'retries_exhausted', 'it has had its `max_attempts`'),
        (12, 'backoff', 'its `next_attempt_at` is still to come: a retry''s backoff, or a delayed first attempt or iteration'),
        (13, 'concurrency_limited', 'nothing of its own holds it, but its concurrency key has its limit of steps in flight'),
        (14, 'rate_limited', 'nothing of its own holds it, but its rate key has no token until the next one arrives'),
        (15, 'waiting_for_worker', 'nothing holds it: it is ready, and waits for a claim that takes its queue and has its handler (explain only: `step_readiness` reports it ready)')
    ) AS v(rank, reason, meaning);
$$;

-- The one list of a task's execution statuses, in precedence order: task_execution_context returns the first that
-- applies (its CASE, in this order: TestExecutionStatusesPrecedence). The first eight are the original ones in
-- their original order; scheduled and flow_limited (issue 26) come after the statuses of a task that is doing
-- something or done, before those of a task waiting for its own steps (docs/state-machine.md says why); waiting
-- (issue 22) right after processing: a task whose step waits for the world is doing something.
CREATE OR REPLACE FUNCTION stepready.execution_statuses()
RETURNS TABLE (rank int, execution_status text, meaning text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT v.rank, v.execution_status, v.meaning FROM (VALUES
        (1, 'cancelled', 'the task is `cancelled`'),
        (2, 'paused', 'the task is paused'),
        (3, 'blocked_by_failures', 'a step is in `error`'),
        (4, 'has_ready_steps', 'a step is ready'),
        (5, 'processing', 'a step is in flight (`enqueued`, `in_progress`, or held by an earlier attempt''s orphaned lease)'),
        (6, 'waiting', 'a wait step is `waiting` for a signal or for its time: the task is running, not stalled'),
        (7, 'all_complete', 'it has steps, and every one is `complete`, `resolved_manually` or `skipped`'),
        (8, 'scheduled', 'its `run_at` is still to come'),
        (9, 'flow_limited', 'a step is held back only by its concurrency or rate key'),
        (10, 'waiting_for_retry', 'a step waits only for its `next_attempt_at`: a backoff, a delayed first attempt or iteration'),
        (11, 'waiting_for_dependencies', 'none of the above: its steps wait for their parents, or for an operator (a step that has used its attempts); also a task with no steps')
    ) AS v(rank, execution_status, meaning);
$$;

-- Why a step is not ready for reasons of its own and of its task, or NULL: ranks 1 to 5, 8 and 10 to 12 of
-- readiness_reasons(), in that order (a wait step's reasons, ranks 6 and 7, a map's window, rank 9, and flow
-- control, ranks 13 and 14, are step_readiness's, for a step this returns NULL for or a reason of a later rank). A step
-- made ready again while an attempt of it still runs (an orphaned lease: sql/046_leases.sql) is in_flight until
-- that attempt ends.
DROP FUNCTION IF EXISTS stepready._blocked_reason(text, bool, text, bool, int, int, bool, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS stepready._blocked_reason(text, bool, text, bool, int, int, bool, timestamptz, timestamptz,
                                                  timestamptz);
CREATE OR REPLACE FUNCTION stepready._blocked_reason(
    p_task_status text, p_task_paused bool, p_task_run_at timestamptz, p_state text, p_dependencies_satisfied bool,
    p_attempts int, p_max_attempts int, p_retryable bool, p_next_attempt_at timestamptz, p_as_of timestamptz,
    p_lease_expires_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_task_status NOT IN ('pending', 'in_progress') THEN 'task_not_active'
        WHEN p_task_paused THEN 'task_paused'
        WHEN p_task_run_at > p_as_of THEN 'scheduled'
        WHEN p_state IN ('complete', 'error', 'skipped', 'cancelled', 'resolved_manually') THEN 'terminal'
        WHEN stepready._holds_slot(p_state, p_lease_expires_at, p_as_of) THEN 'in_flight'
        WHEN NOT p_dependencies_satisfied THEN 'waiting_for_dependencies'
        WHEN NOT stepready.retry_eligible(p_attempts, p_max_attempts, p_retryable)
             AND NOT COALESCE(p_retryable, true) THEN 'not_retryable'
        WHEN NOT stepready.retry_eligible(p_attempts, p_max_attempts, p_retryable) THEN 'retries_exhausted'
        WHEN p_next_attempt_at > p_as_of THEN 'backoff'
    END;
$$;

CREATE OR REPLACE FUNCTION stepready.step_readiness(
    p_task_ids bigint[], p_step_ids bigint[] DEFAULT NULL, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    task_id                bigint,
    step_id                bigint,
    name                   text,
    state                  text,
    attempts               int,
    max_attempts           int,
    retryable              bool,
    total_parents          int,
    completed_parents      int,
    dependencies_satisfied bool,
    retry_eligible         bool,
    next_attempt_at        timestamptz,
    ready                  bool,
    blocked_reason         text)
LANGUAGE sql STABLE
AS $$
    SELECT r.task_id, r.step_id, r.name, r.state, r.attempts, r.max_attempts, r.retryable,
           r.total_parents, r.completed_parents, r.dependencies_satisfied, r.retry_eligible, r.next_attempt_at,
           r.blocked_reason IS NULL AS ready, r.blocked_reason
      FROM (
        SELECT s.task_id, s.id AS step_id, s.name, s.state, s.attempts, s.max_attempts, s.retryable,
               par.total AS total_parents, par.satisfied AS completed_parents,
               par.total = par.satisfied AS dependencies_satisfied,
               stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable) AS retry_eligible,
               s.next_attempt_at,
               CASE
                   -- A wait step that waits (ranks 6 and 7, sql/059_signals.sql): after the reasons of its task and
                   -- those of ranks 4 and 5 (which a waiting step never has), before any of its own retry state.
                   WHEN s.state = 'waiting'
                        AND COALESCE(b.reason, 'backoff') NOT IN ('task_not_active', 'task_paused', 'scheduled')
                       THEN CASE WHEN s.wait ? 'signal' THEN 'waiting_for_signal' ELSE 'sleeping' END
                   -- An element held out of its map's window (rank 9, sql/058_map.sql): after the reasons of
                   -- ranks 1 to 8, before those of its own retry state.
                   WHEN s.map_step_id IS NOT NULL AND s.pending_parents > 0
                        AND COALESCE(b.reason, 'not_retryable') IN ('not_retryable', 'retries_exhausted', 'backoff')
                       THEN 'map_window'
                   ELSE COALESCE(b.reason,
                        -- Flow control last (ranks 11, 12), only for a step that could otherwise start: it reads
                        -- the keys' state, which no other step needs.
                        CASE WHEN s.concurrency_key IS NOT NULL OR s.rate_key IS NOT NULL
                             THEN stepready._flow_blocked(s.concurrency_key, s.concurrency_limit, s.rate_key,
                                                          s.rate_limit, s.rate_period_ms, p_as_of) END)
               END AS blocked_reason
          FROM stepready.steps s
          JOIN stepready.tasks t ON t.id = s.task_id
          -- Parents are read from the table, never from the (possibly filtered) result set.
          CROSS JOIN LATERAL (
              SELECT count(*)::int AS total,
                     (count(*) FILTER (WHERE stepready._satisfies(ps.state)))::int AS satisfied
                FROM stepready.step_edges e
                JOIN stepready.steps ps ON ps.id = e.parent_step_id
               WHERE e.child_step_id = s.id
          ) par
         CROSS JOIN LATERAL (
              SELECT stepready._blocked_reason(t.status, t.paused, t.run_at, s.state, par.total = par.satisfied,
                                               s.attempts, s.max_attempts, s.retryable, s.next_attempt_at, p_as_of,
                                               s.lease_expires_at) AS reason
          ) b
         WHERE s.task_id = ANY (p_task_ids)
           AND (p_step_ids IS NULL OR s.id = ANY (p_step_ids))
      ) r
     ORDER BY r.task_id, r.step_id;
$$;

CREATE OR REPLACE FUNCTION stepready.task_execution_context(p_task_id bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    task_id                 bigint,
    status                  text,
    total_steps             int,
    pending_steps           int,
    in_flight_steps         int,
    waiting_for_retry_steps int,
    completed_steps         int,
    error_steps             int,
    skipped_steps           int,
    cancelled_steps         int,
    ready_steps             int,
    next_attempt_at         timestamptz,
    execution_status        text)
LANGUAGE sql STABLE
AS $$
    SELECT t.id, t.status, c.total, c.pending, c.in_flight, c.waiting, c.completed, c.errored, c.skipped,
           c.cancelled, c.ready, c.next_attempt_at,
           -- The order of execution_statuses().
           CASE
               WHEN t.status = 'cancelled' THEN 'cancelled'
               WHEN t.paused THEN 'paused'
               WHEN c.errored > 0 THEN 'blocked_by_failures'
               WHEN c.ready > 0 THEN 'has_ready_steps'
               WHEN c.in_flight > 0 THEN 'processing'
               WHEN c.waiting_steps > 0 THEN 'waiting'
               WHEN c.total > 0 AND c.satisfied = c.total THEN 'all_complete'
               WHEN c.scheduled > 0 THEN 'scheduled'
               WHEN c.flow > 0 THEN 'flow_limited'
               WHEN c.backoff > 0 THEN 'waiting_for_retry'
               ELSE 'waiting_for_dependencies'
           END
      FROM stepready.tasks t
     CROSS JOIN LATERAL (
        SELECT count(*)::int AS total,
               (count(*) FILTER (WHERE r.state = 'pending'))::int AS pending,
               -- In flight, or made ready again while an earlier attempt still runs (reported in_flight).
               (count(*) FILTER (WHERE r.state IN ('enqueued', 'in_progress')
                                    OR r.blocked_reason = 'in_flight'))::int AS in_flight,
               (count(*) FILTER (WHERE r.state = 'waiting_for_retry'))::int AS waiting,
               (count(*) FILTER (WHERE r.state = 'waiting'))::int AS waiting_steps,
               (count(*) FILTER (WHERE r.state IN ('complete', 'resolved_manually')))::int AS completed,
               (count(*) FILTER (WHERE r.state = 'error'))::int AS errored,
               (count(*) FILTER (WHERE r.state = 'skipped'))::int AS skipped,
               (count(*) FILTER (WHERE r.state = 'cancelled'))::int AS cancelled,
               (count(*) FILTER (WHERE stepready._satisfies(r.state)))::int AS satisfied,
               (count(*) FILTER (WHERE r.ready))::int AS ready,
               -- Held by the task's run_at; held only by a flow control key; waiting only on its backoff
               -- (everything else would let it run).
               (count(*) FILTER (WHERE r.blocked_reason = 'scheduled'))::int AS scheduled,
               (count(*) FILTER (WHERE r.blocked_reason IN ('concurrency_limited', 'rate_limited')))::int AS flow,
               (count(*) FILTER (WHERE r.blocked_reason = 'backoff'))::int AS backoff,
               min(r.next_attempt_at) FILTER (WHERE r.state IN ('pending', 'waiting_for_retry')
                                                AND r.next_attempt_at > p_as_of) AS next_attempt_at
          FROM stepready.step_readiness(ARRAY[t.id], NULL, p_as_of) r
     ) c
     WHERE t.id = p_task_id;
$$;
