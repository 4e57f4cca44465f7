-- Schema version 13: work routing (SPEC §21, issue 23). A claim that names the queues and handlers it takes
-- (p_queues, p_handlers) reads the claimable rows of those (queue, handler) routes only, through this index; an
-- unfiltered claim keeps reading steps_claim_order_idx. Within one route the keys are those of the claim index,
-- so a route's claimable rows are in claim order: priority groups, then fairness keys, then due time and id
-- (docs/design-core.md, "Work routing"). The due time is spelled GREATEST(next_attempt_at, '-infinity'), the
-- same value as the other claim indexes' COALESCE, but an expression only this index has: a routed statement
-- ordered by it cannot be served by steps_claimable_idx (due time, id), which the planner chose for a route's
-- range and read every due step of the other routes before the route's first (10,001 rows for 100).
BEGIN;

CREATE INDEX steps_claim_route_idx
    ON stepready.steps (queue, handler, task_priority, priority, flow_key,
                        (GREATEST(next_attempt_at, '-infinity'::timestamptz)), id)
    WHERE state IN ('pending', 'waiting_for_retry') AND pending_parents = 0 AND NOT task_held;

COMMIT;
