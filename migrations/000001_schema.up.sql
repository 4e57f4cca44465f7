-- stepready schema, version 1: tables, constraints, indexes and seed rows.
-- Behaviour (functions and triggers) lives in sql/ and is re-applied on every `migrate up`.
BEGIN;

CREATE SCHEMA IF NOT EXISTS stepready;

-- Named retry presets. A NULL field means "this preset does not set it": resolution falls through to the next
-- level (SPEC §3).
CREATE TABLE stepready.retry_policies (
    name          text PRIMARY KEY CHECK (name <> ''),
    max_attempts  int CHECK (max_attempts >= 0),
    retryable     bool,
    backoff       text CHECK (backoff IN ('none', 'fixed', 'linear', 'exponential')),
    base_delay_ms bigint CHECK (base_delay_ms >= 0),
    multiplier    float8 CHECK (multiplier >= 1 AND multiplier < 'Infinity'),
    max_delay_ms  bigint CHECK (max_delay_ms >= 0),
    jitter        float8 CHECK (jitter >= 0 AND jitter <= 1)
);

INSERT INTO stepready.retry_policies
    (name, max_attempts, retryable, backoff, base_delay_ms, multiplier, max_delay_ms, jitter)
VALUES
    ('none',       1, false, 'fixed',       0,    1, 0,     0),
    ('standard',   3, true,  'exponential', 1000, 2, 30000, 0),
    ('aggressive', 5, true,  'exponential', 200,  2, 30000, 0),
    ('patient',    3, true,  'exponential', 5000, 3, 90000, 0);

-- Failure classes are data: a class added here works without code.
CREATE TABLE stepready.failure_classes (
    name      text PRIMARY KEY CHECK (name <> ''),
    retryable bool NOT NULL,
    breaker   bool NOT NULL DEFAULT false
);

INSERT INTO stepready.failure_classes (name, retryable, breaker) VALUES
    ('transient',        true,  false),
    ('timeout',          true,  false),
    ('stalled',          true,  false),
    ('rate_limited',     true,  false),
    ('contract_failure', true,  true),
    ('test_failure',     true,  true),
    ('deterministic',    false, true),
    ('permanent',        false, false),
    ('budget_exhausted', false, false),
    ('canceled',         false, false);

CREATE TABLE stepready.tasks (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name              text NOT NULL CHECK (name <> ''),
    namespace         text NOT NULL DEFAULT 'default' CHECK (namespace <> ''),
    context           jsonb NOT NULL DEFAULT '{}',
    priority          int NOT NULL DEFAULT 0,
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'in_progress', 'complete', 'error', 'cancelled')),
    paused            bool NOT NULL DEFAULT false,
    retry             jsonb CHECK (retry IS NULL OR jsonb_typeof(retry) = 'object'),
    idempotency_key   text UNIQUE,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    completed_at      timestamptz,
    -- Maintained by triggers on steps (sql/040_task_status.sql); never written by users.
    steps_total       int NOT NULL DEFAULT 0 CHECK (steps_total >= 0),
    steps_unsatisfied int NOT NULL DEFAULT 0 CHECK (steps_unsatisfied >= 0),
    steps_in_error    int NOT NULL DEFAULT 0 CHECK (steps_in_error >= 0)
);

CREATE INDEX tasks_status_idx ON stepready.tasks (status, id);
CREATE INDEX tasks_name_idx ON stepready.tasks (name, id);

CREATE TABLE stepready.steps (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id             bigint NOT NULL REFERENCES stepready.tasks (id) ON DELETE CASCADE,
    name                text NOT NULL CHECK (name <> ''),
    handler             text NOT NULL CHECK (handler <> ''),
    input               jsonb NOT NULL DEFAULT '{}',
    output              jsonb,
    state               text NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'enqueued', 'in_progress', 'waiting_for_retry', 'complete',
                                         'error', 'skipped', 'cancelled', 'resolved_manually')),
    attempts            int NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- Materialized policy (SPEC §3): filled by the insert trigger, never NULL afterwards except max_delay_ms.
    max_attempts        int CHECK (max_attempts >= 0),
    retryable           bool,
    backoff             text CHECK (backoff IN ('none', 'fixed', 'linear', 'exponential')),
    base_delay_ms       bigint CHECK (base_delay_ms >= 0),
    multiplier          float8 CHECK (multiplier >= 1 AND multiplier < 'Infinity'),
    max_delay_ms        bigint CHECK (max_delay_ms >= 0),
    jitter              float8 CHECK (jitter >= 0 AND jitter <= 1),
    retry_policy        text,
    next_attempt_at     timestamptz,
    last_attempted_at   timestamptz,
    timeout_ms          bigint CHECK (timeout_ms > 0),
    lease_owner         text,
    lease_expires_at    timestamptz,
    last_error          jsonb,
    on_exhausted        text NOT NULL DEFAULT 'fail_task' CHECK (on_exhausted IN ('fail_task', 'skip', 'skip_cascade')),
    rules               jsonb CHECK (rules IS NULL OR jsonb_typeof(rules) = 'array'),
    iteration           int NOT NULL DEFAULT 0 CHECK (iteration >= 0),
    max_iterations      int CHECK (max_iterations >= 1),
    collect             text NOT NULL DEFAULT 'replace' CHECK (collect IN ('append', 'replace', 'merge')),
    breaker_limit       int NOT NULL DEFAULT 3 CHECK (breaker_limit >= 0),
    priority            int NOT NULL DEFAULT 0,
    queue               text NOT NULL DEFAULT 'default' CHECK (queue <> ''),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    completed_at        timestamptz,
    -- Maintained by triggers; never written by users.
    pending_parents     int NOT NULL DEFAULT 0 CHECK (pending_parents >= 0),
    task_held           bool NOT NULL DEFAULT false,
    breaker_fingerprint text,
    breaker_count       int NOT NULL DEFAULT 0 CHECK (breaker_count >= 0),
    UNIQUE (task_id, name)
);

-- The claim index: only rows that could be claimed (not terminal, not in flight, every parent satisfied, task
-- active and unpaused) are in it, keyed by when they become due. claim_ready_steps reads a range of this index,
-- so its cost follows the number of due candidates, not the size of the table.
CREATE INDEX steps_claimable_idx ON stepready.steps ((COALESCE(next_attempt_at, '-infinity'::timestamptz)), id)
    WHERE state IN ('pending', 'waiting_for_retry') AND pending_parents = 0 AND NOT task_held;

-- The reaper reads only leased rows.
CREATE INDEX steps_lease_idx ON stepready.steps (lease_expires_at)
    WHERE state IN ('enqueued', 'in_progress');

CREATE TABLE stepready.step_edges (
    parent_step_id bigint NOT NULL REFERENCES stepready.steps (id) ON DELETE CASCADE,
    child_step_id  bigint NOT NULL REFERENCES stepready.steps (id) ON DELETE CASCADE,
    PRIMARY KEY (parent_step_id, child_step_id)
);

CREATE INDEX step_edges_child_idx ON stepready.step_edges (child_step_id, parent_step_id);

CREATE TABLE stepready.step_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id    bigint NOT NULL REFERENCES stepready.tasks (id) ON DELETE CASCADE,
    step_id    bigint REFERENCES stepready.steps (id) ON DELETE CASCADE,
    attempt    int,
    iteration  int,
    event      text NOT NULL CHECK (event IN ('step.enqueued', 'attempt.started', 'attempt.succeeded',
                                              'attempt.failed', 'policy.evaluated', 'retry.scheduled',
                                              'step.completed', 'step.failed', 'step.skipped', 'step.cancelled',
                                              'step.resolved', 'lease.expired', 'step.released',
                                              'iteration.continued')
                                 OR event LIKE 'operator.%'),
    from_state text,
    to_state   text,
    details    jsonb NOT NULL DEFAULT '{}',
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX step_events_task_idx ON stepready.step_events (task_id, id);
CREATE INDEX step_events_step_idx ON stepready.step_events (step_id, id);

CREATE TABLE stepready.task_templates (
    name       text NOT NULL CHECK (name <> ''),
    version    int NOT NULL DEFAULT 1 CHECK (version >= 1),
    definition jsonb NOT NULL CHECK (jsonb_typeof(definition) = 'object'),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

COMMIT;
