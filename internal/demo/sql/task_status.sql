-- The status of the tasks the account follows. Read before the events of the same round: a task seen complete
-- here committed before the events are read, so its last events are printed before the task's own line.
SELECT id, name, status, completed_at FROM stepready.tasks WHERE id = ANY ($1) ORDER BY id
