-- Schema version 12: the state of one fairness key during one claim (issue 28). _claim_flow_group
-- (sql/048_flow_claim.sql) keeps an array of them, one per key met in a (task priority, step priority) group,
-- where it kept 18 parallel arrays. Internal: no table stores it.
BEGIN;

CREATE TYPE stepready._claim_key AS (
    in_flight          int,          -- slots held when the claim locked the key (_flow_in_flight_keys)
    taken              int,          -- steps this claim took
    pass_taken         int,          -- of which in the current pass
    first_id           bigint,       -- the key's first claimable row as the probe found it, tried by id first
    pos_due            timestamptz,  -- where the key's range was left: the due time and id of its last row taken
    pos_id             bigint,
    open               bool,         -- may give more
    is_full            bool,         -- stopped by its concurrency limit (as read, then as found)
    dirty              bool,         -- something to write back to flow_state
    rate_tat           timestamptz,  -- the token bucket (flow_state.rate_tat)
    wake_at            timestamptz,  -- when the next token arrives, for a key left without one
    concurrency_limit  int,          -- the steps' own limits as applied (flow_state)
    rate_limit         int,
    rate_period_ms     bigint,
    override_concurrency_limit int,  -- the operator's override (flow_limits)
    override_rate_limit        int,
    override_rate_period_ms    bigint,
    key                text          -- the fairness key (flow_key)
);

COMMIT;
