-- Back to schema version 2.
BEGIN;

CREATE INDEX IF NOT EXISTS step_events_step_idx ON stepready.step_events (step_id, id);
ALTER TABLE stepready.tasks SET (fillfactor = 85);

COMMIT;
