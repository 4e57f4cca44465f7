-- Waiting for the world at a glance (SPEC §20), for the metrics (the backlog exporter's stepready_steps_waiting and
-- stepready_signals_* gauges): the steps waiting now, by reason (waiting_for_signal: a `wait: {signal}` step;
-- sleeping: a `wait: {duration_ms}` or `{until}` step), and the mailbox: the signals of the tasks still in the
-- database (received), those a step consumed (delivered) and those not consumed yet (buffered, waiting for their
-- step to start waiting).
--
-- Cost: each count reads one partial index and no finished step: the signal waits through
-- steps_waiting_signal_idx (its predicate: state = 'waiting' AND wait ? 'signal'), the sleeps through the timers'
-- steps_wait_due_idx (a waiting sleep always has its wait_until). The mailbox is counted whole (retention bounds
-- it: a task's signals are pruned with it), the buffered ones through signals_unconsumed_idx.
CREATE OR REPLACE FUNCTION stepready.signal_stats()
RETURNS TABLE (waiting_for_signal bigint, sleeping bigint, received bigint, delivered bigint, buffered bigint)
LANGUAGE sql STABLE
SET jit = off
AS $$
    SELECT (SELECT count(*) FROM stepready.steps s WHERE s.state = 'waiting' AND s.wait ? 'signal'),
           (SELECT count(*) FROM stepready.steps s
             WHERE s.state = 'waiting' AND s.wait_until IS NOT NULL AND NOT s.wait ? 'signal'),
           g.received, g.received - g.buffered, g.buffered
      FROM (SELECT (SELECT count(*) FROM stepready.signals) AS received,
                   (SELECT count(*) FROM stepready.signals x WHERE x.consumed_by IS NULL) AS buffered) g;
$$;
