-- The backlog at a glance (issue 15, shared by the console and the metrics): per queue, how many steps are ready
-- now, in flight, waiting out a retry backoff, due within a minute, and how long the oldest ready step has been
-- waiting to be claimed (the scheduling lag).
--
-- Cost: only the claim index's rows (claimable steps: ready, or due later) and the lease index's rows (steps in
-- flight) are read, both partial indexes; finished steps are never read, however many there are. Sequential
-- scans are off so the plan stays on those indexes whatever the statistics say. A NULL p_as_of means now().
CREATE OR REPLACE FUNCTION stepready.queue_stats(p_as_of timestamptz DEFAULT now())
RETURNS TABLE (queue text, ready bigint, in_flight bigint, waiting_for_retry bigint, due_within_minute bigint,
               oldest_ready_at timestamptz, oldest_ready_seconds float8)
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$
    WITH claimable AS (
        -- The claim index's predicate: claimable now or later.
        SELECT s.queue,
               count(*) FILTER (WHERE COALESCE(s.next_attempt_at, '-infinity') <= COALESCE(p_as_of, now())) AS ready,
               count(*) FILTER (WHERE s.state = 'waiting_for_retry' AND s.next_attempt_at > COALESCE(p_as_of, now())) AS waiting,
               count(*) FILTER (WHERE s.next_attempt_at > COALESCE(p_as_of, now())
                                  AND s.next_attempt_at <= COALESCE(p_as_of, now()) + interval '1 minute') AS due_soon,
               -- A ready step has waited since its backoff ended, or since it last changed (its last parent
               -- completed, it was created).
               min(COALESCE(s.next_attempt_at, s.updated_at))
                   FILTER (WHERE COALESCE(s.next_attempt_at, '-infinity') <= COALESCE(p_as_of, now())) AS oldest
          FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
         GROUP BY s.queue
    ), flight AS (
        -- The lease index's predicate.
        SELECT s.queue, count(*) AS n
          FROM stepready.steps s
         WHERE s.state IN ('enqueued', 'in_progress')
         GROUP BY s.queue
    )
    SELECT q.queue, COALESCE(c.ready, 0), COALESCE(f.n, 0), COALESCE(c.waiting, 0), COALESCE(c.due_soon, 0),
           c.oldest, CASE WHEN c.oldest IS NOT NULL THEN GREATEST(EXTRACT(epoch FROM COALESCE(p_as_of, now()) - c.oldest), 0)::float8 END
      FROM (SELECT c2.queue FROM claimable c2 UNION SELECT f2.queue FROM flight f2) q
      LEFT JOIN claimable c ON c.queue = q.queue
      LEFT JOIN flight f ON f.queue = q.queue
     ORDER BY q.queue;
$$;
