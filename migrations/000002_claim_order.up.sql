-- stepready schema, version 2: a claim that reads only the rows it takes, and cheaper event rows.
BEGIN;

-- The task's priority copied onto its steps (trigger-maintained, like pending_parents), so one index can hold the
-- claimable rows in claim order: task priority, step priority, due time, id.
ALTER TABLE stepready.steps ADD COLUMN task_priority int NOT NULL DEFAULT 0;
UPDATE stepready.steps s SET task_priority = t.priority
  FROM stepready.tasks t
 WHERE t.id = s.task_id AND t.priority <> 0;

-- claim_ready_steps walks this index in order within each (task priority, step priority) group and stops after
-- the rows it takes. Rows waiting on a future backoff are skipped inside the index (their due time is a key
-- column), never fetched.
CREATE INDEX steps_claim_order_idx
    ON stepready.steps (task_priority, priority, (COALESCE(next_attempt_at, '-infinity'::timestamptz)), id)
    WHERE state IN ('pending', 'waiting_for_retry') AND pending_parents = 0 AND NOT task_held;

-- Task rows change on every claim and completion. With no index on status, and room left on each page, those
-- updates are HOT (no index entry written): on a workload of one-step tasks that is a fifth of the database's work
-- per step. Listings by status read the table instead (tasks by id, newest first, filtered).
DROP INDEX stepready.tasks_status_idx;
ALTER TABLE stepready.tasks SET (fillfactor = 85);

-- Events are only ever inserted by stepready's functions, for rows they hold locked, so the foreign keys only
-- re-proved what the inserting function already knew, at a cost of two lookups and two row locks per event.
-- Deleting a task or a step still deletes its events: statement triggers of sql/055_events.sql do it.
ALTER TABLE stepready.step_events
    DROP CONSTRAINT step_events_task_id_fkey,
    DROP CONSTRAINT step_events_step_id_fkey;

COMMIT;
