-- Back to schema version 5.
BEGIN;

DROP TABLE IF EXISTS stepready.schedules;
DROP TRIGGER IF EXISTS tasks_run_at ON stepready.tasks;
DROP FUNCTION IF EXISTS stepready._tasks_run_at();
ALTER TABLE stepready.tasks DROP COLUMN IF EXISTS run_at;

COMMIT;
