-- Explain (issue 5): every reason a step is not ready, not just the first one step_readiness reports. What
-- `scheduler explain` prints comes from here, so the words an operator reads and the rule the claimer applies
-- cannot drift apart: the conditions are the ones of stepready._blocked_reason (050_readiness.sql), each one
-- tested on its own instead of in a CASE.
--
-- The reasons and their ranks are stepready.readiness_reasons() (050_readiness.sql), the one list: each row's rank is
-- read from it, and rows are ordered by it, so the first row of a step is always its blocked_reason. Each branch
-- below tests one reason's condition on its own, in the list's order:
--   task_not_active, task_paused, scheduled, terminal, in_flight: reported for every step;
--   waiting_for_dependencies (one row per parent that does not satisfy the dependency), map_window (an element
--   held out of its map step's max_in_flight window), not_retryable,
--   retries_exhausted, backoff (not when next_attempt_at is the task's run_at, reported as scheduled, or the end of
--   an orphaned lease, reported as in_flight), concurrency_limited, rate_limited (both through _flow_refusal, the
--   claim's rule): only for a step waiting to start (pending or waiting_for_retry). For a terminal or in-flight
--   step they decide nothing (a complete step with attempts = max_attempts is not "exhausted"), and reporting
--   them would only mislead;
--   waiting_for_worker: for a step waiting to start that none of the others holds, i.e. a ready one: the queue
--   and handler a claim must take to start it (work routing: a step no running worker can take stays ready).

-- A wait in plain words, as the CLI prints durations: "850ms" is never shown, "0.9s", "1m05s", "2h03m", and from
-- two days on days and hours, "3d04h" (not "27179h28m").
CREATE OR REPLACE FUNCTION stepready._explain_duration(p_ms bigint)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_ms < 60000 THEN round(p_ms / 1000.0, 1)::text || 's'
        WHEN p_ms < 3600000 THEN (p_ms / 60000)::text || 'm' || lpad(((p_ms % 60000) / 1000)::text, 2, '0') || 's'
        WHEN p_ms < 48 * 3600000 THEN (p_ms / 3600000)::text || 'h' || lpad(((p_ms % 3600000) / 60000)::text, 2, '0') || 'm'
        ELSE (p_ms / 86400000)::text || 'd' || lpad(((p_ms % 86400000) / 3600000)::text, 2, '0') || 'h'
    END;
$$;

-- The reasons of the steps selected by task ids and/or step ids (NULL = no filter on that side). Parent states
-- are read from the table, never from the filtered set, like step_readiness.
CREATE OR REPLACE FUNCTION stepready._explain(p_task_ids bigint[], p_step_ids bigint[], p_as_of timestamptz)
RETURNS TABLE (
    task_id             bigint,
    step_id             bigint,
    step_name           text,
    state               text,
    rank                int,
    reason              text,
    message             text,
    parent_step_id      bigint,
    parent_name         text,
    parent_state        text,
    parent_attempts     int,
    parent_max_attempts int,
    attempts            int,
    max_attempts        int,
    retryable           bool,
    next_attempt_at     timestamptz,
    wait_ms             bigint)
LANGUAGE sql STABLE
AS $$
    WITH s AS (
        SELECT s.id, s.task_id, s.name, s.state, s.attempts, s.max_attempts, s.retryable, s.next_attempt_at,
               s.lease_owner, s.lease_expires_at, s.map_total, s.map_step_id, s.pending_parents, s.queue, s.handler,
               t.status AS task_status, t.paused AS task_paused, t.run_at AS task_run_at,
               s.concurrency_key, s.concurrency_limit, s.rate_key, s.rate_limit, s.rate_period_ms,
               s.wait, s.wait_until,
               s.state IN ('pending', 'waiting_for_retry') AS waiting,
               stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable) AS eligible
          FROM stepready.steps s
          JOIN stepready.tasks t ON t.id = s.task_id
         WHERE (p_task_ids IS NULL OR s.task_id = ANY (p_task_ids))
           AND (p_step_ids IS NULL OR s.id = ANY (p_step_ids))
    ), r AS (
        SELECT s.*, 'task_not_active' AS reason, format('task %s', s.task_status) AS message,
               NULL::bigint AS p_id, NULL::text AS p_name, NULL::text AS p_state, NULL::int AS p_attempts,
               NULL::int AS p_max
          FROM s WHERE s.task_status NOT IN ('pending', 'in_progress')
        UNION ALL
        SELECT s.*, 'task_paused', 'task paused', NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.task_paused
        UNION ALL
        SELECT s.*, 'scheduled',
               format('scheduled: starts at %s (in %s)',
                      to_char(s.task_run_at,
                              CASE WHEN s.task_run_at::date = p_as_of::date THEN 'HH24:MI:SS'
                                   ELSE 'YYYY-MM-DD HH24:MI:SS' END),
                      stepready._explain_duration(ceil(extract(epoch FROM s.task_run_at - p_as_of) * 1000)::bigint)),
               NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.task_run_at > p_as_of
        UNION ALL
        SELECT s.*, 'terminal', format('step is %s', s.state), NULL, NULL, NULL, NULL, NULL
          FROM s WHERE stepready._is_terminal(s.state)
        UNION ALL
        SELECT s.*, 'in_flight',
               CASE WHEN s.map_total IS NOT NULL AND s.state = 'in_progress'
                    -- A map step (sql/058_map.sql): its elements' progress.
                    THEN (SELECT format('mapping: %s of %s elements complete, %s in flight, %s waiting for retry, '
                                        '%s failed', count(*) FILTER (WHERE e.state IN ('complete', 'resolved_manually')),
                                        s.map_total, count(*) FILTER (WHERE e.state IN ('enqueued', 'in_progress')),
                                        count(*) FILTER (WHERE e.state = 'waiting_for_retry'),
                                        count(*) FILTER (WHERE e.state = 'error'))
                            FROM stepready.steps e WHERE e.map_step_id = s.id)
                    ELSE format('in flight: %s, attempt %s/%s', s.state,
                                CASE WHEN s.state = 'in_progress' THEN s.attempts ELSE s.attempts + 1 END,
                                COALESCE(s.max_attempts, 3)) END,
               NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.state IN ('enqueued', 'in_progress')
        UNION ALL
        SELECT s.*, 'in_flight',
               format('in flight: an earlier attempt (worker %s) has not ended; it holds the step until it reports '
                      'or its lease expires at %s (in %s)', COALESCE(s.lease_owner, 'unknown'),
                      to_char(s.lease_expires_at,
                              CASE WHEN s.lease_expires_at::date = p_as_of::date THEN 'HH24:MI:SS'
                                   ELSE 'YYYY-MM-DD HH24:MI:SS' END),
                      stepready._explain_duration(
                          ceil(extract(epoch FROM s.lease_expires_at - p_as_of) * 1000)::bigint)),
               NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.waiting AND stepready._holds_slot(s.state, s.lease_expires_at, p_as_of)
        UNION ALL
        -- A wait step that waits (SPEC §20, sql/059_signals.sql): for what, and until when.
        SELECT s.*, CASE WHEN s.wait ? 'signal' THEN 'waiting_for_signal' ELSE 'sleeping' END,
               CASE WHEN s.wait ? 'signal' THEN format('waiting for signal "%s"', s.wait ->> 'signal') ELSE 'sleeping' END
               || CASE WHEN s.wait_until IS NULL THEN ' (no timeout)'
                       ELSE format(' until %s (in %s)%s',
                                   to_char(s.wait_until, CASE WHEN s.wait_until::date = p_as_of::date THEN 'HH24:MI:SS'
                                                              ELSE 'YYYY-MM-DD HH24:MI:SS' END),
                                   stepready._explain_duration(
                                       GREATEST(ceil(extract(epoch FROM s.wait_until - p_as_of) * 1000), 0)::bigint),
                                   CASE WHEN s.wait ? 'signal'
                                        THEN format(', then %s', CASE WHEN s.wait ->> 'on_timeout' = 'continue'
                                                                      THEN 'continues with output null'
                                                                      ELSE 'fails (timeout)' END)
                                        ELSE '' END) END,
               NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.state = 'waiting'
        UNION ALL
        SELECT s.*, 'waiting_for_dependencies',
               format('waiting for `%s` (%s, attempt %s/%s)', ps.name, ps.state, ps.attempts,
                      COALESCE(ps.max_attempts, 3)),
               ps.id, ps.name, ps.state, ps.attempts, ps.max_attempts
          FROM s
          JOIN stepready.step_edges e ON e.child_step_id = s.id
          JOIN stepready.steps ps ON ps.id = e.parent_step_id
         WHERE s.waiting AND NOT stepready._satisfies(ps.state)
        UNION ALL
        -- An element held out of its map's window (sql/058_map.sql).
        SELECT s.*, 'map_window',
               (SELECT format('waiting for a slot of map step `%s`: %s of %s in flight', m.name,
                              (SELECT count(*) FROM stepready.steps f
                                WHERE f.map_step_id = m.id AND f.pending_parents = 0
                                  AND NOT stepready._is_terminal(f.state)),
                              COALESCE(m.map ->> 'max_in_flight', '?'))
                  FROM stepready.steps m WHERE m.id = s.map_step_id),
               NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.waiting AND s.map_step_id IS NOT NULL AND s.pending_parents > 0
        UNION ALL
        SELECT s.*, 'not_retryable', 'not retryable after first attempt', NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.waiting AND NOT s.eligible AND NOT COALESCE(s.retryable, true)
        UNION ALL
        SELECT s.*, 'retries_exhausted',
               format('retries exhausted %s/%s', s.attempts, COALESCE(s.max_attempts, 3)),
               NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.waiting AND NOT s.eligible AND COALESCE(s.retryable, true)
        UNION ALL
        SELECT s.*, 'backoff',
               format('backoff until %s (in %s)',
                      -- The date only when it is not the day of p_as_of (session time zone).
                      to_char(s.next_attempt_at,
                              CASE WHEN s.next_attempt_at::date = p_as_of::date THEN 'HH24:MI:SS'
                                   ELSE 'YYYY-MM-DD HH24:MI:SS' END),
                      stepready._explain_duration(
                          ceil(extract(epoch FROM s.next_attempt_at - p_as_of) * 1000)::bigint)),
               NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.waiting AND s.next_attempt_at > p_as_of
                   AND s.next_attempt_at IS DISTINCT FROM s.task_run_at
                   -- the wait for an earlier attempt's end (_orphan_hold), already reported as in_flight
                   AND s.next_attempt_at IS DISTINCT FROM stepready._orphan_hold(s.lease_expires_at, p_as_of)
        UNION ALL
        SELECT s.*, 'concurrency_limited',
               format('concurrency limited by %s: %s of %s in flight', s.concurrency_key, c.in_flight, c.lim),
               NULL, NULL, NULL, NULL, NULL
          FROM s
         CROSS JOIN LATERAL (
            SELECT stepready._flow_in_flight(s.concurrency_key, p_as_of) AS in_flight,
                   COALESCE((SELECT l.concurrency_limit FROM stepready.flow_limits l WHERE l.key = s.concurrency_key),
                            s.concurrency_limit) AS lim) c
         WHERE s.waiting AND s.concurrency_key IS NOT NULL
           AND stepready._flow_refusal(c.in_flight, c.lim, NULL, NULL, NULL, p_as_of) = 'concurrency_limited'
        UNION ALL
        SELECT s.*, 'rate_limited',
               format('rate limited by %s: next slot in %s', s.rate_key,
                      stepready._explain_duration(ceil(extract(epoch FROM n.at - p_as_of) * 1000)::bigint)),
               NULL, NULL, NULL, NULL, NULL
          FROM s
         CROSS JOIN LATERAL (
            SELECT stepready._flow_next_token(f.rate_tat, COALESCE(l.rate_limit, s.rate_limit),
                                              COALESCE(l.rate_period_ms, s.rate_period_ms), p_as_of) AS at,
                   stepready._flow_refusal(NULL, NULL, f.rate_tat, COALESCE(l.rate_limit, s.rate_limit),
                                           COALESCE(l.rate_period_ms, s.rate_period_ms), p_as_of) AS why
              FROM (SELECT 1) one
              LEFT JOIN stepready.flow_state f ON f.key = s.rate_key
              LEFT JOIN stepready.flow_limits l ON l.key = s.rate_key) n
         WHERE s.waiting AND s.rate_key IS NOT NULL AND n.why = 'rate_limited'
    )
    , w AS (
        SELECT * FROM r
        UNION ALL
        SELECT s.*, 'waiting_for_worker',
               format('ready: waits for a worker that takes queue %s and has handler %s', s.queue, s.handler),
               NULL, NULL, NULL, NULL, NULL
          FROM s WHERE s.waiting AND NOT EXISTS (SELECT 1 FROM r WHERE r.id = s.id)
    )
    SELECT r.task_id, r.id, r.name, r.state, rr.rank, r.reason, r.message, r.p_id, r.p_name, r.p_state,
           r.p_attempts, r.p_max, r.attempts, r.max_attempts, r.retryable, r.next_attempt_at,
           CASE WHEN r.next_attempt_at > p_as_of
                THEN ceil(extract(epoch FROM r.next_attempt_at - p_as_of) * 1000)::bigint END
      FROM w r
      JOIN stepready.readiness_reasons() rr ON rr.reason = r.reason
     ORDER BY r.task_id, r.id, rr.rank, r.p_id;
$$;

-- Every reason step p_step_id is not ready at p_as_of, one row per reason in precedence order (one row per
-- unsatisfied parent); one row, waiting_for_worker, when it is ready and waits for a claim. An unknown step raises
-- P0002, like the operator functions.
CREATE OR REPLACE FUNCTION stepready.explain_step(p_step_id bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    task_id             bigint,
    step_id             bigint,
    step_name           text,
    state               text,
    rank                int,
    reason              text,
    message             text,
    parent_step_id      bigint,
    parent_name         text,
    parent_state        text,
    parent_attempts     int,
    parent_max_attempts int,
    attempts            int,
    max_attempts        int,
    retryable           bool,
    next_attempt_at     timestamptz,
    wait_ms             bigint)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    IF NOT EXISTS (SELECT 1 FROM stepready.steps s WHERE s.id = p_step_id) THEN
        RAISE EXCEPTION 'step % does not exist', p_step_id USING ERRCODE = 'P0002';
    END IF;
    RETURN QUERY SELECT * FROM stepready._explain(NULL, ARRAY[p_step_id], COALESCE(p_as_of, now()));
END;
$$;

-- explain_step for every step of task p_task_id, ordered by step id then precedence; a ready step has its one
-- waiting_for_worker row.
-- An unknown task raises P0002.
CREATE OR REPLACE FUNCTION stepready.explain_task(p_task_id bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    task_id             bigint,
    step_id             bigint,
    step_name           text,
    state               text,
    rank                int,
    reason              text,
    message             text,
    parent_step_id      bigint,
    parent_name         text,
    parent_state        text,
    parent_attempts     int,
    parent_max_attempts int,
    attempts            int,
    max_attempts        int,
    retryable           bool,
    next_attempt_at     timestamptz,
    wait_ms             bigint)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    IF NOT EXISTS (SELECT 1 FROM stepready.tasks t WHERE t.id = p_task_id) THEN
        RAISE EXCEPTION 'task % does not exist', p_task_id USING ERRCODE = 'P0002';
    END IF;
    RETURN QUERY SELECT * FROM stepready._explain(ARRAY[p_task_id], NULL, COALESCE(p_as_of, now()));
END;
$$;
