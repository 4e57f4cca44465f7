-- Back to schema version 1. The behaviour that only version 2 has (the statement triggers that delete events
-- and apply step state changes, the batch functions) is dropped here, so that the version-1 build's sql/ files,
-- applied by its `migrate up`, find the row triggers they define alone.
BEGIN;

DROP TRIGGER IF EXISTS steps_after_update ON stepready.steps;
DROP TRIGGER IF EXISTS steps_delete_events ON stepready.steps;
DROP TRIGGER IF EXISTS tasks_delete_events ON stepready.tasks;
DROP TRIGGER IF EXISTS tasks_propagate_priority ON stepready.tasks;
DROP FUNCTION IF EXISTS stepready.start_steps(bigint[], text, bigint, timestamptz);
DROP FUNCTION IF EXISTS stepready.complete_steps(bigint[], int[], jsonb[], timestamptz);
DROP FUNCTION IF EXISTS stepready.claim_and_start_steps(int, text, bigint, timestamptz);
DROP FUNCTION IF EXISTS stepready.fail_steps(bigint[], int[], jsonb[], timestamptz, float8[]);

-- Orphans cannot exist while the delete triggers run; remove any all the same so the constraints can be added.
DELETE FROM stepready.step_events e WHERE NOT EXISTS (SELECT 1 FROM stepready.tasks t WHERE t.id = e.task_id);
DELETE FROM stepready.step_events e
 WHERE e.step_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM stepready.steps s WHERE s.id = e.step_id);
ALTER TABLE stepready.step_events
    ADD CONSTRAINT step_events_task_id_fkey FOREIGN KEY (task_id) REFERENCES stepready.tasks (id) ON DELETE CASCADE,
    ADD CONSTRAINT step_events_step_id_fkey FOREIGN KEY (step_id) REFERENCES stepready.steps (id) ON DELETE CASCADE;

ALTER TABLE stepready.tasks RESET (fillfactor);
CREATE INDEX IF NOT EXISTS tasks_status_idx ON stepready.tasks (status, id);

DROP INDEX IF EXISTS stepready.steps_claim_order_idx;
ALTER TABLE stepready.steps DROP COLUMN IF EXISTS task_priority;

COMMIT;
