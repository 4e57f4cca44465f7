-- The backlog at a glance (issue 15, shared by the console and the metrics): per queue, how many steps are ready
-- now, hold a slot (in flight, or an orphaned lease not expired: _holds_slot), wait out a retry backoff, are due
-- within a minute, and how long the oldest ready step has been waiting to be claimed (the scheduling lag).
--
-- Cost, bounded whatever the backlog (issue 28): the steps holding slots are few (at most the daemons'
-- concurrency, plus orphaned leases) and always counted exactly, through the lease indexes. The claimable steps
-- are counted exactly when there are at most _read_budget() of them (one capped read of the claim index tells);
-- above, their figures are estimated from a sample of about _read_budget() rows of the table (TABLESAMPLE SYSTEM:
-- random pages), scaled up, and `estimated` is true. An estimated oldest_ready_at is the oldest among the rows
-- read (the true lag may be longer). Finished steps are only read in that sample. A NULL p_as_of means now().
--
-- Measured with 1,000,000 ready steps (docs/benchmarks.md): 250-330 ms exact, a few ms estimated.
DROP FUNCTION IF EXISTS stepready.queue_stats(timestamptz); -- before `estimated` and orphaned leases
CREATE OR REPLACE FUNCTION stepready.queue_stats(p_as_of timestamptz DEFAULT now())
RETURNS TABLE (queue text, ready bigint, in_flight bigint, waiting_for_retry bigint, due_within_minute bigint,
               oldest_ready_at timestamptz, oldest_ready_seconds float8, estimated bool)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
-- Every statement reads a bounded number of rows, but the generic plan of the exact count is costed for the
-- whole claim index: at that cost PostgreSQL would compile it (JIT, 60-100 ms) and start parallel workers.
SET jit = off
SET max_parallel_workers_per_gather = 0
AS $$
#variable_conflict use_column
DECLARE
    v_as_of     timestamptz := COALESCE(p_as_of, now());
    v_budget    int := stepready._read_budget();
    v_estimated bool;
    v_pct       float8 := 100;   -- the share of the table's pages read by the sample, in percent
    v_rows      float8;          -- the table's rows, estimated from its current size
BEGIN
    -- The claim index's predicate: claimable now or later. Capped: at most v_budget + 1 entries are read.
    v_estimated := (SELECT count(*) FROM (SELECT 1 FROM stepready.steps s
                                           WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                             AND NOT s.task_held
                                           LIMIT v_budget + 1) c) > v_budget;
    IF v_estimated THEN
        -- Pages now times rows per page at the last VACUUM or ANALYZE (50 before any).
        SELECT pg_catalog.pg_relation_size(c.oid) / current_setting('block_size')::float8
               * CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages ELSE 50 END
          INTO v_rows
          FROM pg_catalog.pg_class c WHERE c.oid = 'stepready.steps'::regclass;
        v_pct := LEAST(100, GREATEST(100.0 * v_budget / GREATEST(v_rows, 1), 0.000001));
    END IF;
    RETURN QUERY
    WITH claimable AS (
        SELECT s.queue,
               count(*) FILTER (WHERE COALESCE(s.next_attempt_at, '-infinity') <= v_as_of) AS ready,
               count(*) FILTER (WHERE s.state = 'waiting_for_retry' AND s.next_attempt_at > v_as_of) AS waiting,
               count(*) FILTER (WHERE s.next_attempt_at > v_as_of
                                  AND s.next_attempt_at <= v_as_of + interval '1 minute') AS due_soon,
               -- A ready step has waited since its backoff ended, or since it last changed (its last parent
               -- completed, it was created).
               min(COALESCE(s.next_attempt_at, s.updated_at))
                   FILTER (WHERE COALESCE(s.next_attempt_at, '-infinity') <= v_as_of) AS oldest
          FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND NOT v_estimated
         GROUP BY s.queue
        UNION ALL
        -- Above the budget: a sample of the table's pages, its counts scaled up.
        SELECT s.queue,
               round(count(*) FILTER (WHERE COALESCE(s.next_attempt_at, '-infinity') <= v_as_of) * 100 / v_pct)::bigint,
               round(count(*) FILTER (WHERE s.state = 'waiting_for_retry' AND s.next_attempt_at > v_as_of)
                     * 100 / v_pct)::bigint,
               round(count(*) FILTER (WHERE s.next_attempt_at > v_as_of
                                        AND s.next_attempt_at <= v_as_of + interval '1 minute') * 100 / v_pct)::bigint,
               min(COALESCE(s.next_attempt_at, s.updated_at))
                   FILTER (WHERE COALESCE(s.next_attempt_at, '-infinity') <= v_as_of)
          FROM stepready.steps s TABLESAMPLE SYSTEM (v_pct)
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND v_estimated
         GROUP BY s.queue
    ), flight AS (
        -- The rows of the two lease indexes (steps_lease_idx: in flight; steps_orphan_lease_idx: orphaned leases),
        -- counted by the one rule of what holds a slot.
        SELECT s.queue, count(*) AS n
          FROM stepready.steps s
         WHERE (s.state IN ('enqueued', 'in_progress')
                OR (s.lease_expires_at IS NOT NULL AND s.state NOT IN ('enqueued', 'in_progress')))
           AND stepready._holds_slot(s.state, s.lease_expires_at, v_as_of)
         GROUP BY s.queue
    )
    SELECT q.queue, COALESCE(c.ready, 0), COALESCE(f.n, 0), COALESCE(c.waiting, 0), COALESCE(c.due_soon, 0),
           c.oldest, CASE WHEN c.oldest IS NOT NULL THEN GREATEST(EXTRACT(epoch FROM v_as_of - c.oldest), 0)::float8 END,
           v_estimated
      FROM (SELECT c2.queue FROM claimable c2 UNION SELECT f2.queue FROM flight f2) q
      LEFT JOIN claimable c ON c.queue = q.queue
      LEFT JOIN flight f ON f.queue = q.queue
     ORDER BY q.queue;
END;
$$;
