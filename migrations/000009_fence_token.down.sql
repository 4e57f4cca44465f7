-- Back to schema version 8.
BEGIN;

DROP INDEX IF EXISTS stepready.steps_orphan_lease_idx;
DROP INDEX IF EXISTS stepready.steps_in_flight_key_idx;
-- Version 8 knows no lease outside flight: an orphaned lease is dropped (its slot is freed at once, as version 8
-- did when the operator acted).
UPDATE stepready.steps SET lease_owner = NULL, lease_expires_at = NULL
 WHERE state NOT IN ('enqueued', 'in_progress') AND (lease_owner IS NOT NULL OR lease_expires_at IS NOT NULL);
ALTER TABLE stepready.steps DROP COLUMN IF EXISTS fence_token;
CREATE INDEX steps_in_flight_key_idx ON stepready.steps (concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('enqueued', 'in_progress');

COMMIT;
