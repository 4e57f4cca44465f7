-- Back to schema version 15: the mailbox is dropped; waiting steps are cancelled first (version 15 has no such
-- state), then the columns, the indexes and the events' and states' constraints as they were. The triggers whose
-- functions read the new columns are dropped with them; the version-15 build's sql/ files, applied by its
-- `migrate up`, create theirs again, as every down migration leaves it.
BEGIN;

DROP TRIGGER IF EXISTS steps_after_update ON stepready.steps;
DROP TRIGGER IF EXISTS steps_wait_inserted ON stepready.steps;
DROP FUNCTION IF EXISTS stepready._steps_wait_inserted();

DROP TABLE stepready.signals;

UPDATE stepready.steps SET state = 'cancelled', completed_at = COALESCE(completed_at, now()) WHERE state = 'waiting';
DELETE FROM stepready.step_events
 WHERE event IN ('wait.started', 'wait.timed_out', 'signal.received', 'signal.delivered');

ALTER TABLE stepready.step_events DROP CONSTRAINT step_events_event_check;
ALTER TABLE stepready.step_events ADD CONSTRAINT step_events_event_check
    CHECK (event IN ('step.enqueued', 'attempt.started', 'attempt.succeeded', 'attempt.failed', 'policy.evaluated',
                     'retry.scheduled', 'step.completed', 'step.failed', 'step.skipped', 'step.cancelled',
                     'step.resolved', 'lease.expired', 'step.released', 'iteration.continued')
           OR event LIKE 'operator.%');

ALTER TABLE stepready.steps DROP CONSTRAINT steps_state_check;
ALTER TABLE stepready.steps ADD CONSTRAINT steps_state_check
    CHECK (state IN ('pending', 'enqueued', 'in_progress', 'waiting_for_retry', 'complete', 'error', 'skipped',
                     'cancelled', 'resolved_manually'));

DROP INDEX stepready.steps_waiting_signal_idx;
DROP INDEX stepready.steps_wait_due_idx;
ALTER TABLE stepready.steps
    DROP COLUMN wait_until,
    DROP COLUMN wait;

COMMIT;
