-- The read model (package readmodel): every query behind what an operator sees. Each is scanned into its typed
-- value in exactly one place (the Go function named in its comment); the console, the CLI and the metrics render
-- those values. No scheduling rule is re-derived here: reasons come from stepready.explain_task / explain_step
-- and step_readiness, the execution status from task_execution_context, the backlog from queue_stats, flow
-- control from flow_status. TestEveryQueryRuns runs each of them against a migrated database, so a renamed
-- column fails `make test`, not a page.

-- name: now
-- The snapshot's clock (now() is the transaction's start).
SELECT now();

-- name: tasks
-- ListTasks: a page of tasks, newest first, keyset-paginated on id (no OFFSET): $1 status, or 'paused' for the
-- paused tasks, $2 name, $3 namespace (NULL = any), $4 the last id of the previous page (NULL = first page), $5 the
-- page size.
SELECT t.id, t.name, t.namespace, t.status, t.paused, t.steps_total, t.steps_unsatisfied, t.created_at, t.updated_at
  FROM stepready.tasks t
 WHERE ($1::text IS NULL OR t.status = $1 OR ($1 = 'paused' AND t.paused))
   AND ($2::text IS NULL OR t.name = $2)
   AND ($3::text IS NULL OR t.namespace = $3)
   AND ($4::bigint IS NULL OR t.id < $4)
 ORDER BY t.id DESC
 LIMIT $5;

-- name: task_count_estimate
-- CountTasks: the planner's estimate of the number of tasks (pg_class.reltuples; -1 before the first ANALYZE).
SELECT COALESCE((SELECT c.reltuples::bigint FROM pg_catalog.pg_class c WHERE c.oid = 'stepready.tasks'::regclass), -1);

-- name: status_counts
-- CountTasks: exact counts per status, below the estimate threshold.
SELECT t.status, count(*) FROM stepready.tasks t GROUP BY t.status ORDER BY t.status;

-- name: status_estimates
-- CountTasks: counts per status from the planner's statistics (pg_stats most common values times reltuples).
SELECT v.status::text, (v.freq * c.reltuples)::bigint
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_stats s ON s.schemaname = 'stepready' AND s.tablename = 'tasks' AND s.attname = 'status'
 CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(status, freq)
 WHERE c.oid = 'stepready.tasks'::regclass
 ORDER BY 1;

-- name: task
-- ReadTask: task $1 with its execution context at $2.
SELECT t.id, t.name, t.namespace, t.status, t.paused, t.steps_total, t.steps_unsatisfied, t.created_at,
       t.updated_at, t.priority, t.context, t.completed_at, t.run_at, c.execution_status, c.next_attempt_at
  FROM stepready.tasks t CROSS JOIN stepready.task_execution_context(t.id, $2) c
 WHERE t.id = $1;

-- name: steps
-- ReadTask, ReadStep: the steps of task $1 ($3: these steps only, NULL = all) with step_readiness at $2, the
-- first explain message of a step that is not ready (the rank order of blocked_reason), its parents' names and
-- its output; of a map step (SPEC §19) its element counts (in flight: enqueued or in_progress), of an element its
-- map step and index.
SELECT s.id, s.name, s.handler, s.queue, s.state, s.attempts, s.max_attempts, s.next_attempt_at, r.ready,
       r.blocked_reason,
       CASE WHEN NOT r.ready THEN
           (SELECT x.message FROM stepready.explain_step(s.id, $2) x ORDER BY x.rank, x.parent_step_id LIMIT 1)
       END,
       s.last_error,
       ARRAY(SELECT p.name FROM stepready.step_edges e JOIN stepready.steps p ON p.id = e.parent_step_id
              WHERE e.child_step_id = s.id ORDER BY p.id),
       s.output,
       s.map IS NOT NULL, s.map_total, s.map_done, s.map_failed,
       CASE WHEN s.map_total IS NOT NULL THEN
           (SELECT count(*)::int FROM stepready.steps e
             WHERE e.map_step_id = s.id AND e.state IN ('enqueued', 'in_progress'))
       END,
       s.map_step_id, s.element_index
  FROM stepready.steps s
  JOIN stepready.step_readiness(ARRAY[$1]::bigint[], $3, $2) r ON r.step_id = s.id
 ORDER BY s.id;

-- name: edges
-- ReadTask: the edges between the steps of task $1.
SELECT e.parent_step_id, e.child_step_id
  FROM stepready.step_edges e
  JOIN stepready.steps s ON s.id = e.child_step_id
 WHERE s.task_id = $1
 ORDER BY e.child_step_id, e.parent_step_id;

-- name: events
-- Events: events of task $1 ($4: of this step only, NULL = all), newest first, keyset on id: $2 the last id of
-- the previous page (NULL = first), $3 limit.
SELECT ev.id, ev.task_id, ev.step_id, s.name, ev.attempt, ev.iteration, ev.event, ev.from_state, ev.to_state,
       ev.details, ev.at
  FROM stepready.step_events ev
  LEFT JOIN stepready.steps s ON s.id = ev.step_id
 WHERE ev.task_id = $1 AND ($2::bigint IS NULL OR ev.id < $2) AND ($4::bigint IS NULL OR ev.step_id = $4)
 ORDER BY ev.id DESC
 LIMIT $3;

-- name: task_exists
-- TaskTimeline: whether task $1 exists.
SELECT EXISTS (SELECT 1 FROM stepready.tasks t WHERE t.id = $1);

-- name: timeline
-- Timeline: every event of task $1, oldest first.
SELECT ev.id, ev.task_id, ev.step_id, s.name, ev.attempt, ev.iteration, ev.event, ev.from_state, ev.to_state,
       ev.details, ev.at
  FROM stepready.step_events ev
  LEFT JOIN stepready.steps s ON s.id = ev.step_id
 WHERE ev.task_id = $1
 ORDER BY ev.id;

-- name: new_events
-- EventCursor.Poll: the events with an id above $1 (the cursor's floor), oldest first, at most $2, with their
-- task's and step's names: a range of the primary key, whatever the table holds.
SELECT ev.id, ev.task_id, t.name, ev.step_id, s.name, ev.attempt, ev.iteration, ev.event, ev.from_state, ev.to_state,
       ev.details, ev.at
  FROM stepready.step_events ev
  JOIN stepready.tasks t ON t.id = ev.task_id
  LEFT JOIN stepready.steps s ON s.id = ev.step_id
 WHERE ev.id > $1
 ORDER BY ev.id
 LIMIT $2;

-- name: last_event_id
-- NewEventCursor: the newest event id (the cursor starts after it).
SELECT COALESCE(max(ev.id), 0) FROM stepready.step_events ev;

-- name: attempts
-- ReadTask, ReadStep: one row per run of the steps of task $1 ($2: one step, NULL = all): its attempt number, its
-- start, its end and outcome (succeeded, failed, lease expired, or running), from step_events. A run is what
-- follows one attempt.started event of the step, up to the next: attempt numbers repeat after reset_task or a
-- repetition (continue_step), runs do not.
WITH ev AS (
    SELECT ev.id, ev.step_id, ev.attempt, ev.event, ev.details, ev.at,
           count(*) FILTER (WHERE ev.event = 'attempt.started') OVER (PARTITION BY ev.step_id ORDER BY ev.id) AS run
      FROM stepready.step_events ev
     WHERE ev.task_id = $1 AND ev.step_id IS NOT NULL AND ($2::bigint IS NULL OR ev.step_id = $2)
)
SELECT ev.step_id,
       min(ev.attempt) FILTER (WHERE ev.event = 'attempt.started') AS attempt,
       min(ev.at) FILTER (WHERE ev.event = 'attempt.started') AS started,
       max(ev.at) FILTER (WHERE ev.event IN ('attempt.succeeded', 'attempt.failed', 'lease.expired')) AS ended,
       COALESCE((array_agg(ev.event ORDER BY ev.id DESC)
                 FILTER (WHERE ev.event IN ('attempt.succeeded', 'attempt.failed', 'lease.expired')))[1],
                'running') AS outcome,
       (array_agg(ev.details ORDER BY ev.id DESC)
        FILTER (WHERE ev.event IN ('attempt.failed', 'lease.expired')))[1] AS error
  FROM ev
 WHERE ev.run > 0
 GROUP BY ev.step_id, ev.run
 ORDER BY started, ev.step_id;

-- name: step
-- ReadStep: what the step page shows beyond its row in steps: its task, input, output, iteration; its deps and
-- its input resolved against them now (SPEC §18: the functions the start uses, sql/019_dataflow.sql), or why it
-- does not resolve yet; of a wait step (SPEC §20) its wait and, while it waits, its deadline.
SELECT s.task_id, s.input, s.output, s.iteration, s.max_iterations, s.timeout_ms, s.priority, s.retry_policy,
       d.deps, CASE WHEN s.input_refs THEN r.value ELSE s.input END, r.problem, s.wait,
       CASE WHEN s.state = 'waiting' THEN s.wait_until END
  FROM stepready.steps s
 CROSS JOIN LATERAL (SELECT stepready._step_deps(s.id) AS deps) d
  LEFT JOIN LATERAL (SELECT x.value, x.problem
                       FROM stepready._resolve_input(s.input, d.deps,
                                (SELECT t.context FROM stepready.tasks t WHERE t.id = s.task_id), s.task_id) x
                      WHERE s.input_refs) r ON true
 WHERE s.task_id = $1 AND s.id = $2;

-- name: elements
-- ReadStepPage: a page of the elements of map step $1 (SPEC §19) in element order, those after index $2, at most
-- $3 (keyset on steps_map_elements_idx).
SELECT e.id, e.name, e.element_index, e.state, e.attempts, e.max_attempts, e.last_error, e.output
  FROM stepready.steps e
 WHERE e.map_step_id = $1 AND e.element_index > $2
 ORDER BY e.element_index
 LIMIT $3;

-- name: step_by_name
-- StepID: the id of step $2 of task $1.
SELECT s.id FROM stepready.steps s WHERE s.task_id = $1 AND s.name = $2;

-- name: step_task
-- StepTask: the task of step $1.
SELECT s.task_id FROM stepready.steps s WHERE s.id = $1;

-- name: reasons_task
-- Explain: every reason of every step of task $1 at $2, in precedence order.
SELECT x.step_id, x.reason, x.message, x.parent_step_id, x.parent_name, x.parent_state, x.parent_attempts,
       x.parent_max_attempts, x.next_attempt_at, x.wait_ms
  FROM stepready.explain_task($1, $2) x
 ORDER BY x.step_id, x.rank;

-- name: reasons_step
-- Explain, ReadStep: every reason of step $1 at $2, in precedence order.
SELECT x.step_id, x.reason, x.message, x.parent_step_id, x.parent_name, x.parent_state, x.parent_attempts,
       x.parent_max_attempts, x.next_attempt_at, x.wait_ms
  FROM stepready.explain_step($1, $2) x
 ORDER BY x.rank;

-- name: template_exists
-- TemplateExists: whether any version of template $1 is stored.
SELECT EXISTS (SELECT 1 FROM stepready.task_templates WHERE name = $1);

-- name: created_task
-- CreatedTask: the number of steps of task $1 and its run_at when it is still to come.
SELECT (SELECT count(*)::int FROM stepready.steps s WHERE s.task_id = t.id), CASE WHEN t.run_at > now() THEN t.run_at END
  FROM stepready.tasks t WHERE t.id = $1;

-- name: templates
-- Templates: every version of every template, by name and version; whether it is the newest, its step count.
SELECT t.name, t.version, t.version = max(t.version) OVER (PARTITION BY t.name),
       COALESCE(jsonb_array_length(CASE WHEN jsonb_typeof(t.definition -> 'steps') = 'array' THEN t.definition -> 'steps' END), 0),
       t.definition, t.created_at
  FROM stepready.task_templates t ORDER BY t.name, t.version;

-- name: policies
-- Policies: the retry presets.
SELECT p.name, p.max_attempts, p.retryable, p.backoff, p.base_delay_ms, p.multiplier, p.max_delay_ms, p.jitter
  FROM stepready.retry_policies p ORDER BY p.name;

-- name: policy
-- Simulate: preset $1 with each field replaced by its override when not NULL ($2 max_attempts, $3 retryable,
-- $4 backoff, $5 base_delay_ms, $6 multiplier, $7 max_delay_ms, $8 uncapped: max_delay_ms NULL, $9 jitter).
SELECT p.name, COALESCE($2, p.max_attempts), COALESCE($3, p.retryable), COALESCE($4, p.backoff),
       COALESCE($5, p.base_delay_ms), COALESCE($6, p.multiplier),
       CASE WHEN $8 THEN NULL ELSE COALESCE($7, p.max_delay_ms) END, COALESCE($9, p.jitter)
  FROM stepready.retry_policies p WHERE p.name = $1;

-- name: simulate
-- Simulate: the timeline of a policy ($1 max_attempts, $2 retryable, $3 backoff, $4 base_delay_ms, $5 multiplier,
-- $6 max_delay_ms, $7 jitter), for at most $9 attempts. Attempt k fails; retry_eligible(k, …) says whether a
-- retry follows (exactly fail_step's exhaustion rule), and the delay is the jittered backoff of attempt k, with
-- jitter samples drawn by random() in attempt order when $8 (the caller seeded it), else 0.
WITH a AS (
    SELECT k, CASE WHEN $8 THEN random() ELSE 0 END AS sample
      FROM generate_series(1, LEAST(GREATEST(COALESCE($1::int, 3), 1), $9)) AS k
), d AS (
    SELECT k, stepready.retry_eligible(k, $1, $2) AS retry, sample,
           stepready.backoff_delay_ms($3, k, $4, $5, $6) AS backoff
      FROM a
), j AS (
    SELECT k, retry, sample, backoff,
           CASE WHEN retry THEN stepready._jittered_delay_ms(backoff, $7, sample) END AS delay
      FROM d
)
SELECT k, COALESCE(sum(delay) OVER (ORDER BY k ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::bigint,
       retry, CASE WHEN retry THEN backoff END, CASE WHEN retry AND $8 THEN sample END, delay,
       CASE WHEN retry THEN sum(delay) OVER (ORDER BY k)::bigint END
  FROM j ORDER BY k;

-- name: setseed
SELECT setseed($1);

-- name: signals
-- A task's signals (SPEC §20, stepready.signals), oldest first, with the name of the step that consumed each.
SELECT g.id, g.task_id, g.name, g.payload, g.idempotency_key, g.created_at, g.consumed_by, s.name, g.consumed_at
  FROM stepready.signals g
  LEFT JOIN stepready.steps s ON s.id = g.consumed_by
 WHERE g.task_id = $1
 ORDER BY g.id;

-- name: signal
-- One signal by id.
SELECT g.id, g.task_id, g.name, g.payload, g.idempotency_key, g.created_at, g.consumed_by, s.name, g.consumed_at
  FROM stepready.signals g
  LEFT JOIN stepready.steps s ON s.id = g.consumed_by
 WHERE g.id = $1;

-- name: waiting_for_signal
-- WaitingForSignal: the steps of tasks $1 waiting for a signal now (SPEC §20), oldest first, through
-- steps_waiting_signal_idx.
SELECT s.task_id, s.id, s.name, s.wait ->> 'signal'
  FROM stepready.steps s
 WHERE s.task_id = ANY($1) AND s.state = 'waiting' AND s.wait ? 'signal'
 ORDER BY s.id;
