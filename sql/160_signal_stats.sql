-- Waiting for the world at a glance (SPEC §20), for the metrics (the backlog exporter's stepready_steps_waiting and
-- stepready_signals_* gauges): the steps waiting now, by reason (waiting_for_signal: a `wait: {signal}` step;
-- sleeping: a `wait: {duration_ms}` or `{until}` step), and the mailbox: the signals of the tasks still in the
-- database (received), those a step consumed (delivered) and those not consumed yet (buffered, waiting for their
-- step to start waiting).
--
-- Cost: the waiting steps are read through the partial index steps_waiting_signal_idx (state = 'waiting'), so a
-- table of finished steps costs nothing; the mailbox is counted whole (retention bounds it: a task's signals are
-- pruned with it), the buffered ones through signals_unconsumed_idx.
CREATE OR REPLACE FUNCTION stepready.signal_stats()
RETURNS TABLE (waiting_for_signal bigint, sleeping bigint, received bigint, delivered bigint, buffered bigint)
LANGUAGE sql STABLE
AS $$
    SELECT w.for_signal, w.sleeping, g.received, g.received - g.buffered, g.buffered
      FROM (SELECT count(*) FILTER (WHERE s.wait ? 'signal')     AS for_signal,
                   count(*) FILTER (WHERE NOT (s.wait ? 'signal')) AS sleeping
              FROM stepready.steps s WHERE s.state = 'waiting') w,
           (SELECT count(*) AS received, count(*) FILTER (WHERE x.consumed_by IS NULL) AS buffered
              FROM stepready.signals x) g;
$$;
