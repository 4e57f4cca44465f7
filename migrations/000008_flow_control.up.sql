-- stepready schema, version 8: flow control (SPEC §14). Concurrency and rate limits per key, and round-robin
-- fairness between keys, enforced by the claim functions (sql/047_flow.sql, sql/060_claim.sql).
BEGIN;

-- The materialized flow control of a step: filled from its definition (placeholders resolved) by the insert
-- trigger. A key without its limit (or a limit without its key) is refused by that trigger.
ALTER TABLE stepready.steps
    ADD COLUMN concurrency_key   text   CHECK (concurrency_key <> ''),
    ADD COLUMN concurrency_limit int    CHECK (concurrency_limit >= 1),
    ADD COLUMN rate_key          text   CHECK (rate_key <> ''),
    ADD COLUMN rate_limit        int    CHECK (rate_limit >= 1),
    ADD COLUMN rate_period_ms    bigint CHECK (rate_period_ms >= 1),
    -- The key a step is scheduled fairly under: its concurrency key, else its rate key, else '' (the one group
    -- of steps without a key). Never NULL, so that a claim reads one group with an equality.
    ADD COLUMN flow_key          text   NOT NULL GENERATED ALWAYS AS (COALESCE(concurrency_key, rate_key, '')) STORED;

-- The claim index gains the fairness key between the priorities and the due time: within a (task priority,
-- step priority) group each key's claimable rows are one range in due order, and the next key is one probe.
DROP INDEX stepready.steps_claim_order_idx;
CREATE INDEX steps_claim_order_idx
    ON stepready.steps (task_priority, priority, flow_key, (COALESCE(next_attempt_at, '-infinity'::timestamptz)), id)
    WHERE state IN ('pending', 'waiting_for_retry') AND pending_parents = 0 AND NOT task_held;

-- Steps in flight per concurrency key: a claim counts at most `limit` entries of one key.
CREATE INDEX steps_in_flight_key_idx ON stepready.steps (concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('enqueued', 'in_progress');

-- Operator overrides: a non-NULL value wins over the steps' own and takes effect at the next claim.
CREATE TABLE stepready.flow_limits (
    key               text PRIMARY KEY CHECK (key <> ''),
    concurrency_limit int CHECK (concurrency_limit >= 1),
    rate_limit        int CHECK (rate_limit >= 1),
    rate_period_ms    bigint CHECK (rate_period_ms >= 1),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period_ms IS NULL))
);

-- Per-key state, written only by claims (a row is created by the first claim of its key). The row lock
-- serializes the claims of one key; claims of other keys never wait on it. In-flight counts are not stored:
-- they are counted from steps_in_flight_key_idx, so every path out of flight (complete, fail, release, reap,
-- cancel, reset, delete) releases without touching this table.
--   rate_tat  the rate limiter's theoretical arrival time (GCRA: a token bucket kept as one timestamp); NULL:
--             a full bucket.
--   wake_at   when the next token arrives for a key that had claimable steps and no token at its last claim;
--             next_flow_at reads it so that daemons wake for the token instead of polling.
--   is_full   the last claim left claimable steps of the key behind because its concurrency limit was
--             reached: a step of the key leaving flight then notifies the daemons (sql/040_task_status.sql).
--   concurrency_limit, rate_limit, rate_period_ms
--             the steps' own limits as the key's last claim applied them (shown by flow_status).
CREATE TABLE stepready.flow_state (
    key               text PRIMARY KEY,
    rate_tat          timestamptz,
    wake_at           timestamptz,
    is_full           bool NOT NULL DEFAULT false,
    concurrency_limit int,
    rate_limit        int,
    rate_period_ms    bigint
);
CREATE INDEX flow_state_wake_idx ON stepready.flow_state (wake_at) WHERE wake_at IS NOT NULL;

-- The round-robin position: the last fairness key a claim served. One row; a claim that finds it locked by
-- another claim leaves it to that claim.
CREATE TABLE stepready.flow_cursor (
    id       int PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    last_key text
);
INSERT INTO stepready.flow_cursor (id) VALUES (1);

COMMIT;
