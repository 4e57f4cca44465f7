-- Schema version 16: signals and durable sleeps (SPEC §20, issue 22; docs/signals.md, docs/design-core.md
-- "Signals and durable sleeps").
--
-- On a step: wait (the definition's {signal, timeout_ms, on_timeout} | {duration_ms} | {until}; NULL for a step
-- run by a handler) and wait_until (while the step is `waiting`: when its sleep ends or its signal wait times out;
-- NULL for a signal wait without a timeout). A new state, `waiting`: not terminal, not claimable (the claim indexes'
-- predicates name pending and waiting_for_retry only, so nothing changes there).
--
-- stepready.signals: the mailbox. A signal is consumed by at most one step (consumed_by, consumed_at), and its
-- idempotency key is unique per task. Deleted with its task (prune_tasks deletes tasks).
-- Adding nullable columns without a default rewrites nothing.
BEGIN;

ALTER TABLE stepready.steps
    ADD COLUMN wait       jsonb CHECK (wait IS NULL OR jsonb_typeof(wait) = 'object'),
    ADD COLUMN wait_until timestamptz;

ALTER TABLE stepready.steps DROP CONSTRAINT steps_state_check;
ALTER TABLE stepready.steps ADD CONSTRAINT steps_state_check
    CHECK (state IN ('pending', 'enqueued', 'in_progress', 'waiting_for_retry', 'waiting', 'complete', 'error',
                     'skipped', 'cancelled', 'resolved_manually'));

ALTER TABLE stepready.step_events DROP CONSTRAINT step_events_event_check;
ALTER TABLE stepready.step_events ADD CONSTRAINT step_events_event_check
    CHECK (event IN ('step.enqueued', 'attempt.started', 'attempt.succeeded', 'attempt.failed', 'policy.evaluated',
                     'retry.scheduled', 'step.completed', 'step.failed', 'step.skipped', 'step.cancelled',
                     'step.resolved', 'lease.expired', 'step.released', 'iteration.continued',
                     'wait.started', 'wait.timed_out', 'signal.received', 'signal.delivered')
           OR event LIKE 'operator.%');

-- The timers: waiting steps by deadline. The claim's round trip fires the due ones (a range of this index from
-- its start) and next_claim_at reads its first entry.
CREATE INDEX steps_wait_due_idx ON stepready.steps (wait_until, id) WHERE state = 'waiting' AND wait_until IS NOT NULL;

-- A signal finds the oldest step of its task waiting for its name. (`wait ? 'signal'` in the predicate: no query of
-- the timers implies it, so none of them can read this index instead of steps_wait_due_idx, whatever the
-- statistics say.)
CREATE INDEX steps_waiting_signal_idx ON stepready.steps (task_id, (wait ->> 'signal'), id)
    WHERE state = 'waiting' AND wait ? 'signal';

CREATE TABLE stepready.signals (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint NOT NULL REFERENCES stepready.tasks (id) ON DELETE CASCADE,
    name            text NOT NULL CHECK (name <> '' AND char_length(name) <= 255),
    payload         jsonb NOT NULL DEFAULT '{}',
    idempotency_key text CHECK (idempotency_key <> ''),
    created_at      timestamptz NOT NULL DEFAULT now(),
    consumed_by     bigint,
    consumed_at     timestamptz,
    CONSTRAINT signals_consumed_shape CHECK ((consumed_by IS NULL) = (consumed_at IS NULL)),
    CONSTRAINT signals_task_key UNIQUE (task_id, idempotency_key)
);

-- A task's signals in order (signal list, the cascade of a task's deletion), and the unconsumed ones of a name,
-- oldest first (what a step that starts waiting takes).
CREATE INDEX signals_task_idx ON stepready.signals (task_id, id);
CREATE INDEX signals_unconsumed_idx ON stepready.signals (task_id, name, id) WHERE consumed_by IS NULL;

COMMIT;
