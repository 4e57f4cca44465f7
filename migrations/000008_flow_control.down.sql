-- Back to schema version 7.
BEGIN;

DROP TABLE IF EXISTS stepready.flow_cursor;
DROP TABLE IF EXISTS stepready.flow_state CASCADE;
DROP TABLE IF EXISTS stepready.flow_limits CASCADE;
DROP INDEX IF EXISTS stepready.steps_in_flight_key_idx;
DROP INDEX IF EXISTS stepready.steps_claim_order_idx;
ALTER TABLE stepready.steps
    DROP COLUMN IF EXISTS flow_key,
    DROP COLUMN IF EXISTS concurrency_key,
    DROP COLUMN IF EXISTS concurrency_limit,
    DROP COLUMN IF EXISTS rate_key,
    DROP COLUMN IF EXISTS rate_limit,
    DROP COLUMN IF EXISTS rate_period_ms;
CREATE INDEX steps_claim_order_idx
    ON stepready.steps (task_priority, priority, (COALESCE(next_attempt_at, '-infinity'::timestamptz)), id)
    WHERE state IN ('pending', 'waiting_for_retry') AND pending_parents = 0 AND NOT task_held;

COMMIT;
