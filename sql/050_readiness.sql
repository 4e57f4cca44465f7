-- Readiness (SPEC §5): whether each step may start at p_as_of, and why not. These functions read the truth
-- (parent rows, task row); the claim path uses the trigger-maintained pending_parents counter, which the
-- boundary tests hold equal to what step_readiness computes here.

-- Why a step is not ready, or NULL when it is. The order of the checks is the documented precedence. A step made
-- ready again while an attempt of it still runs (an orphaned lease: sql/046_leases.sql) is in_flight until that
-- attempt ends.
DROP FUNCTION IF EXISTS stepready._blocked_reason(text, bool, text, bool, int, int, bool, timestamptz, timestamptz);
CREATE OR REPLACE FUNCTION stepready._blocked_reason(
    p_task_status text, p_task_paused bool, p_state text, p_dependencies_satisfied bool,
    p_attempts int, p_max_attempts int, p_retryable bool, p_next_attempt_at timestamptz, p_as_of timestamptz,
    p_lease_expires_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_task_status NOT IN ('pending', 'in_progress') THEN 'task_not_active'
        WHEN p_task_paused THEN 'task_paused'
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
               CASE WHEN t.status IN ('pending', 'in_progress') AND NOT t.paused AND t.run_at > p_as_of
                    THEN 'scheduled' -- SPEC §15: right after task_paused
                    ELSE COALESCE(stepready._blocked_reason(t.status, t.paused, s.state,
                                                            par.total = par.satisfied, s.attempts,
                                                            s.max_attempts, s.retryable, s.next_attempt_at,
                                                            p_as_of, s.lease_expires_at),
                                  -- SPEC §14: after backoff, only for a step that could otherwise start.
                                  CASE WHEN s.concurrency_key IS NOT NULL OR s.rate_key IS NOT NULL
                                       THEN stepready._flow_blocked(s.concurrency_key, s.concurrency_limit,
                                                                    s.rate_key, s.rate_limit, s.rate_period_ms,
                                                                    p_as_of) END) END AS blocked_reason
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
           CASE
               WHEN t.status = 'cancelled' THEN 'cancelled'
               WHEN t.paused THEN 'paused'
               WHEN c.errored > 0 THEN 'blocked_by_failures'
               WHEN c.ready > 0 THEN 'has_ready_steps'
               WHEN c.in_flight > 0 THEN 'processing'
               WHEN c.total > 0 AND c.satisfied = c.total THEN 'all_complete'
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
               (count(*) FILTER (WHERE r.state IN ('complete', 'resolved_manually')))::int AS completed,
               (count(*) FILTER (WHERE r.state = 'error'))::int AS errored,
               (count(*) FILTER (WHERE r.state = 'skipped'))::int AS skipped,
               (count(*) FILTER (WHERE r.state = 'cancelled'))::int AS cancelled,
               (count(*) FILTER (WHERE stepready._satisfies(r.state)))::int AS satisfied,
               (count(*) FILTER (WHERE r.ready))::int AS ready,
               -- Waiting only on its backoff: everything else would let it run. A delayed start (run_at,
               -- reported as scheduled) is a delayed first attempt, like a backoff.
               (count(*) FILTER (WHERE r.blocked_reason IN ('backoff', 'scheduled')))::int AS backoff,
               min(r.next_attempt_at) FILTER (WHERE r.state IN ('pending', 'waiting_for_retry')
                                                AND r.next_attempt_at > p_as_of) AS next_attempt_at
          FROM stepready.step_readiness(ARRAY[t.id], NULL, p_as_of) r
     ) c
     WHERE t.id = p_task_id;
$$;
