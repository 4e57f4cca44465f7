-- stepready schema, version 9 (issue 27): a fencing token that never repeats for a step, and leases that outlive
-- an operator's action on a running attempt ("orphaned leases"). docs/design-core.md explains both.
BEGIN;

-- The fencing token of a step's attempts: incremented by every start of an attempt (start_steps,
-- claim_and_start_steps) and never lowered, whatever happens to `attempts` (reset_task, continue_step and a
-- release set it back). Heartbeats and results are fenced on it, so a run that started before a reset can never
-- be taken for one that started after it.
ALTER TABLE stepready.steps ADD COLUMN fence_token int NOT NULL DEFAULT 0 CHECK (fence_token >= 0);

-- Until this version attempts were fenced by their attempt number: a step that may still run starts from it, so
-- an attempt running across the upgrade keeps its token, and the next start is numbered past every attempt
-- number a worker of the older release may hold. Complete and resolved steps never run again and keep 0. The
-- triggers of steps are left out: nothing they maintain depends on the token, and updated_at keeps its meaning.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                WHERE tgrelid = 'stepready.steps'::regclass AND tgname = 'steps_before_update') THEN
        ALTER TABLE stepready.steps DISABLE TRIGGER steps_before_update;
        ALTER TABLE stepready.steps DISABLE TRIGGER steps_after_update;
        UPDATE stepready.steps SET fence_token = attempts
         WHERE attempts > 0 AND state NOT IN ('complete', 'resolved_manually');
        ALTER TABLE stepready.steps ENABLE TRIGGER steps_before_update;
        ALTER TABLE stepready.steps ENABLE TRIGGER steps_after_update;
    ELSE
        UPDATE stepready.steps SET fence_token = attempts
         WHERE attempts > 0 AND state NOT IN ('complete', 'resolved_manually');
    END IF;
END;
$$;

-- A step holds a slot of its concurrency key while it is in flight, and also after an operator moved it out of
-- flight while its attempt still ran (cancel_task, resolve_step): its lease is kept, orphaned, until the old
-- worker reports or the lease expires. The in-flight count reads both from this index.
DROP INDEX stepready.steps_in_flight_key_idx;
CREATE INDEX steps_in_flight_key_idx ON stepready.steps (concurrency_key)
    WHERE concurrency_key IS NOT NULL AND (state IN ('enqueued', 'in_progress') OR lease_expires_at IS NOT NULL);

-- Orphaned leases, for the reaper that clears them once expired (steps_lease_idx holds the leases in flight).
CREATE INDEX steps_orphan_lease_idx ON stepready.steps (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL AND state NOT IN ('enqueued', 'in_progress');

COMMIT;
