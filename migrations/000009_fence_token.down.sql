-- Back to schema version 8. The behaviour that only version 9 has is dropped here, so that the version-8 build's
-- sql/ files, applied by its `migrate up`, can create theirs: the functions whose result columns changed, the
-- helpers of the fencing token and of orphaned leases, and the trigger whose WHEN clause reads fence_token (the
-- version-8 files create it again).
BEGIN;

DROP TRIGGER IF EXISTS steps_before_update ON stepready.steps;
DROP FUNCTION IF EXISTS stepready.start_steps(bigint[], text, bigint, timestamptz);
DROP FUNCTION IF EXISTS stepready.claim_and_start_steps(int, text, bigint, timestamptz);
DROP FUNCTION IF EXISTS stepready._blocked_reason(text, bool, text, bool, int, int, bool, timestamptz, timestamptz,
                                                  timestamptz);
DROP FUNCTION IF EXISTS stepready._flow_in_flight(text, timestamptz);
DROP FUNCTION IF EXISTS stepready._flow_in_flight_keys(jsonb, timestamptz);
DROP FUNCTION IF EXISTS stepready._holds_slot(text, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS stepready._orphan_hold(timestamptz, timestamptz);
DROP FUNCTION IF EXISTS stepready._end_orphans(bigint[], int[]);
DROP FUNCTION IF EXISTS stepready._lock_step_and_task(bigint);
DROP FUNCTION IF EXISTS stepready._lock_retries();
DROP FUNCTION IF EXISTS stepready._orphan_details(stepready.steps);

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
