-- stepready schema, version 6: delayed start (tasks.run_at) and cron schedules (SPEC §15).
BEGIN;

-- The earliest start of every step of the task (NULL: no delay). The steps' next_attempt_at is set to it when
-- they are inserted (sql/020_policy.sql) and when it changes (sql/120_run_at.sql), so the claim index and
-- next_claim_at treat it like a backoff: a task scheduled for next year costs one index entry per step, and
-- nothing at claim time, until then.
ALTER TABLE stepready.tasks ADD COLUMN run_at timestamptz;

-- Cron schedules: the elected leader creates one task per fire time from the template. The columns of SPEC §15
-- first; the rest is bookkeeping documented in docs/tables.md. cron and timezone are validated by the Go entry
-- points (SQL cannot parse cron); a row inserted by plain SQL with a bad one is reported in last_error.
CREATE TABLE stepready.schedules (
    name            text PRIMARY KEY CHECK (name <> ''),
    template        text NOT NULL CHECK (template <> ''),
    cron            text NOT NULL CHECK (cron <> ''),
    timezone        text NOT NULL DEFAULT 'UTC' CHECK (timezone <> ''),
    context         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(context) = 'object'),
    overlap         text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip')),
    paused          bool NOT NULL DEFAULT false,
    next_fire_at    timestamptz,
    last_fired_at   timestamptz,
    last_task_id    bigint,
    -- Fires skipped by overlap: skip (the previous task was still running).
    last_skipped_at timestamptz,
    skipped_count   bigint NOT NULL DEFAULT 0,
    -- Why the last fire (or the computation of the next fire time) failed; cleared by the next successful fire.
    last_error      text,
    last_error_at   timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The leader's two questions, "what is due" and "when is the next one", read only unpaused schedules by due time.
CREATE INDEX schedules_due_idx ON stepready.schedules (next_fire_at) WHERE NOT paused;

COMMIT;
