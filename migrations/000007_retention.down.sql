BEGIN;

DROP FUNCTION IF EXISTS stepready.prune_tasks(timestamptz, text[], int);
DROP INDEX IF EXISTS stepready.tasks_completed_at_idx;

COMMIT;
