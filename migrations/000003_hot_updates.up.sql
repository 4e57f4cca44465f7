-- stepready schema, version 3: cheaper writes on the hot path (claim, start, complete).
BEGIN;

-- Every step claimed and every step finished updates its task's row (status, counters). Those updates are HOT
-- (no index entry written) only when the new row version fits on the same page. A claim batch takes steps in id
-- order, so it updates every task on a page in one statement: with half of each page free there is room for a
-- new version of every row, and the next update finds the old versions pruned. At fillfactor 85, most of those
-- updates wrote three index entries each (measured: five WAL records per task row instead of two). Pages written
-- before this migration keep their old fill until rewritten (VACUUM FULL or pg_repack).
ALTER TABLE stepready.tasks SET (fillfactor = 50);

-- A step's events are read and deleted together with its task (task events, explain, the delete triggers), so
-- the index by step only cost one index entry per event: four per step worked.
DROP INDEX IF EXISTS stepready.step_events_step_idx;

COMMIT;
