-- The read model (package readmodel): every query behind what an operator sees, by name, for the web console
-- and the CLI. They render what these return; no scheduling rule is re-derived in Go (reasons come from
-- stepready.explain_task and step_readiness, the backlog from queue_stats, flow control from flow_status).

-- The console's pages.

-- name: tasks
-- A page of tasks, newest first, keyset-paginated on id (no OFFSET): $1 status, $2 name, $3 namespace
-- (NULL = any), $4 the last id of the previous page (NULL = first page), $5 the page size plus one.
SELECT t.id, t.name, t.namespace, t.status, t.paused, t.steps_total, t.steps_unsatisfied, t.created_at
  FROM stepready.tasks t
 WHERE ($1::text IS NULL OR t.status = $1)
   AND ($2::text IS NULL OR t.name = $2)
   AND ($3::text IS NULL OR t.namespace = $3)
   AND ($4::bigint IS NULL OR t.id < $4)
 ORDER BY t.id DESC
 LIMIT $5;

-- name: task_count_estimate
-- The planner's estimate of the number of tasks (pg_class.reltuples; -1 before the first ANALYZE).
SELECT COALESCE((SELECT c.reltuples::bigint FROM pg_catalog.pg_class c WHERE c.oid = 'stepready.tasks'::regclass), -1);

-- name: status_counts
-- Exact counts per status; used only below the console's estimate threshold.
SELECT t.status, count(*) FROM stepready.tasks t GROUP BY t.status ORDER BY t.status;

-- name: status_estimates
-- Counts per status from the planner's statistics (pg_stats most common values times reltuples).
SELECT v.status::text, (v.freq * c.reltuples)::bigint
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_stats s ON s.schemaname = 'stepready' AND s.tablename = 'tasks' AND s.attname = 'status'
 CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(status, freq)
 WHERE c.oid = 'stepready.tasks'::regclass
 ORDER BY 1;

-- name: task
SELECT t.id, t.name, t.namespace, t.status, t.paused, t.context::text, t.created_at, t.updated_at, t.completed_at
  FROM stepready.tasks t WHERE t.id = $1;

-- name: steps
-- The steps of task $1 with their first explain reason (stepready.explain_task, the rank order of
-- step_readiness.blocked_reason); a ready step has none.
SELECT s.id, s.name, s.state, s.attempts, COALESCE(s.max_attempts, 0), s.next_attempt_at, s.last_error::text,
       s.queue, s.handler, e.message
  FROM stepready.steps s
  LEFT JOIN (SELECT DISTINCT ON (x.step_id) x.step_id, x.message
               FROM stepready.explain_task($1, $2) x
              ORDER BY x.step_id, x.rank) e ON e.step_id = s.id
 WHERE s.task_id = $1
 ORDER BY s.id;

-- name: edges
SELECT e.parent_step_id, e.child_step_id
  FROM stepready.step_edges e
  JOIN stepready.steps s ON s.id = e.child_step_id
 WHERE s.task_id = $1;

-- name: events
-- Events of task $1, newest first, keyset on id: $2 the last id of the previous page (NULL = first), $3 limit.
SELECT ev.id, ev.step_id, COALESCE(s.name, ''), ev.attempt, ev.event, COALESCE(ev.from_state, ''),
       COALESCE(ev.to_state, ''), ev.details::text, ev.at
  FROM stepready.step_events ev
  LEFT JOIN stepready.steps s ON s.id = ev.step_id
 WHERE ev.task_id = $1 AND ($2::bigint IS NULL OR ev.id < $2)
 ORDER BY ev.id DESC
 LIMIT $3;

-- name: attempts
-- One row per attempt of the steps of task $1 ($2: one step, NULL = all): its start, its end and outcome
-- (succeeded, failed, or running), from step_events.
SELECT ev.step_id, ev.attempt,
       min(ev.at) FILTER (WHERE ev.event = 'attempt.started') AS started,
       max(ev.at) FILTER (WHERE ev.event IN ('attempt.succeeded', 'attempt.failed', 'lease.expired')) AS ended,
       COALESCE((array_agg(ev.event ORDER BY ev.id DESC)
                 FILTER (WHERE ev.event IN ('attempt.succeeded', 'attempt.failed', 'lease.expired')))[1],
                'running') AS outcome,
       COALESCE((array_agg(ev.details::text ORDER BY ev.id DESC)
                 FILTER (WHERE ev.event IN ('attempt.failed', 'lease.expired')))[1], '') AS error
  FROM stepready.step_events ev
 WHERE ev.task_id = $1 AND ev.attempt IS NOT NULL AND ev.step_id IS NOT NULL
   AND ($2::bigint IS NULL OR ev.step_id = $2)
 GROUP BY ev.step_id, ev.attempt
HAVING min(ev.at) FILTER (WHERE ev.event = 'attempt.started') IS NOT NULL
 ORDER BY started;

-- name: step
SELECT s.id, s.task_id, s.name, s.state, s.attempts, COALESCE(s.max_attempts, 0), s.handler, s.input::text,
       COALESCE(s.output::text, ''), COALESCE(s.last_error::text, ''), s.iteration, s.next_attempt_at
  FROM stepready.steps s WHERE s.task_id = $1 AND s.id = $2;

-- name: step_events
SELECT ev.id, ev.attempt, ev.iteration, ev.event, COALESCE(ev.from_state, ''), COALESCE(ev.to_state, ''),
       ev.details::text, ev.at
  FROM stepready.step_events ev
 WHERE ev.step_id = $1
 ORDER BY ev.id DESC
 LIMIT 200;

-- name: explain_step
SELECT x.reason, x.message FROM stepready.explain_step($1, $2) x ORDER BY x.rank;

-- name: templates
SELECT t.name, t.version, t.definition::text, t.created_at FROM stepready.task_templates t ORDER BY t.name, t.version DESC;

-- name: policies
SELECT p.name, p.max_attempts, p.retryable, p.backoff, p.base_delay_ms, p.multiplier, p.max_delay_ms, p.jitter
  FROM stepready.retry_policies p ORDER BY p.name;

-- name: policy_timeline
-- The `scheduler policy simulate` timeline of preset $1 without jitter: attempt k starts at starts_ms; it
-- is followed by a retry after delay_ms, or not (the same SQL functions as the CLI and fail_step).
WITH p AS (
    SELECT * FROM stepready.retry_policies WHERE name = $1
), d AS (
    SELECT k, stepready.retry_eligible(k, p.max_attempts, p.retryable) AS retry,
           stepready._jittered_delay_ms(stepready.backoff_delay_ms(p.backoff, k, p.base_delay_ms, p.multiplier,
                                                                    p.max_delay_ms), 0, 0) AS delay
      FROM p, generate_series(1, LEAST(GREATEST(COALESCE(p.max_attempts, 3), 1), 50)) AS k
)
SELECT k, COALESCE(sum(CASE WHEN retry THEN delay END) OVER (ORDER BY k ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::bigint,
       retry, CASE WHEN retry THEN delay END
  FROM d ORDER BY k;

-- name: queue_stats
SELECT q.queue, q.ready, q.in_flight, q.waiting_for_retry, q.due_within_minute, q.oldest_ready_seconds
  FROM stepready.queue_stats($1) q;

-- name: regclass
SELECT to_regclass($1) IS NOT NULL;

-- name: last_event
SELECT COALESCE(max(ev.id), 0) FROM stepready.step_events ev WHERE ev.task_id = $1;

-- The CLI: `task list`, `task show`, `task events`, `explain`.

-- name: task_list
-- Newest first: $1 status ('' = any), $2 name ('' = any), $3 limit.
SELECT t.id, t.name, t.namespace, t.status, t.paused,
       (SELECT count(*)::int FROM stepready.steps s WHERE s.task_id = t.id), t.created_at, t.updated_at
  FROM stepready.tasks t
 WHERE ($1 = '' OR t.status = $1) AND ($2 = '' OR t.name = $2)
 ORDER BY t.id DESC LIMIT $3;

-- name: task_show_header
-- Task $1 with its execution context at $2.
SELECT t.id, t.name, t.namespace, t.status, t.paused, c.total_steps, t.created_at, t.updated_at, c.execution_status,
       c.next_attempt_at, t.run_at
  FROM stepready.tasks t CROSS JOIN stepready.task_execution_context(t.id, $2) c
 WHERE t.id = $1;

-- name: task_show_steps
-- The steps of task $1 with step_readiness at $2; for a step held by flow control (SPEC §14), explain's message
-- naming the key; its parents' names.
SELECT s.id, s.name, s.handler, s.state, s.attempts, s.max_attempts, s.next_attempt_at, r.ready, r.blocked_reason,
       CASE WHEN r.blocked_reason IN ('concurrency_limited', 'rate_limited')
            THEN (SELECT x.message FROM stepready.explain_step(s.id, $2) x WHERE x.reason = r.blocked_reason)
       END,
       s.last_error,
       ARRAY(SELECT p.name FROM stepready.step_edges e JOIN stepready.steps p ON p.id = e.parent_step_id
              WHERE e.child_step_id = s.id ORDER BY p.id)
  FROM stepready.steps s
  JOIN stepready.step_readiness(ARRAY[$1]::bigint[], NULL, $2) r ON r.step_id = s.id
 ORDER BY s.id;

-- name: task_exists
SELECT EXISTS (SELECT 1 FROM stepready.tasks WHERE id = $1);

-- name: task_timeline
-- Every event of task $1, oldest first.
SELECT e.id, e.at, e.step_id, s.name, e.attempt, e.iteration, e.event, e.from_state, e.to_state, e.details,
       to_char(e.at, 'YYYY-MM-DD HH24:MI:SS.MS')
  FROM stepready.step_events e LEFT JOIN stepready.steps s ON s.id = e.step_id
 WHERE e.task_id = $1 ORDER BY e.id;

-- name: step_task
SELECT task_id FROM stepready.steps WHERE id = $1;

-- name: explain_task_row
SELECT id, name, status, paused FROM stepready.tasks WHERE id = $1;

-- name: explain_readiness
-- The steps of task $1 ($2: these steps only, NULL = all) and whether each is ready at $3.
SELECT step_id, name, state, attempts, max_attempts, ready
  FROM stepready.step_readiness(ARRAY[$1]::bigint[], $2, $3);

-- name: explain_reasons_task
-- Every reason of every step of task $1 at $2, in precedence order.
SELECT step_id, reason, message, parent_step_id, parent_name, parent_state, parent_attempts, parent_max_attempts,
       next_attempt_at, wait_ms
  FROM stepready.explain_task($1, $2);

-- name: explain_reasons_step
-- Every reason of step $1 at $2, in precedence order.
SELECT step_id, reason, message, parent_step_id, parent_name, parent_state, parent_attempts, parent_max_attempts,
       next_attempt_at, wait_ms
  FROM stepready.explain_step($1, $2);
