-- Back to schema version 5.
BEGIN;

-- CASCADE: the functions of sql/130_schedules.sql that return its row type go with it (re-created by up).
DROP TABLE IF EXISTS stepready.schedules CASCADE;
DROP TRIGGER IF EXISTS tasks_run_at ON stepready.tasks;
DROP FUNCTION IF EXISTS stepready._tasks_run_at();
DROP TRIGGER IF EXISTS tasks_notify_run_at ON stepready.tasks;
DROP FUNCTION IF EXISTS stepready._tasks_notify_run_at();
ALTER TABLE stepready.tasks DROP COLUMN IF EXISTS run_at;

COMMIT;
