-- Leases and concurrency slots (issue 27; docs/design-core.md, "Fencing token and orphaned leases").
--
-- A started attempt runs under a lease (lease_owner, lease_expires_at) and is fenced by the step's fencing token
-- (steps.fence_token, incremented by every start, never lowered). An operator who moves a running step out of
-- flight (cancel_task, resolve_step) cannot stop its handler: the lease stays on the row, orphaned, until the old
-- worker reports (any fenced call of its token after the handler returned: complete, fail, continue, release,
-- record_policy_evaluation) or the lease expires. While it lasts the step keeps its concurrency slot and, when
-- it is made ready again (reset_task, retry_step_now), is not due before the lease ends: one step never runs
-- twice at once, and a key never has more running than its limit.

-- Whether a step holds a slot of its concurrency key at p_as_of: it is in flight (enqueued or in_progress,
-- expired lease or not, until the reaper handles it), or it holds an orphaned lease that has not expired
-- (expiry is strict: a lease ends when lease_expires_at < p_as_of). The one definition of "in flight" for flow
-- control: every count of steps in flight reads it. A SQL function, inlined where it is used, so a count over
-- steps_in_flight_key_idx (whose predicate this implies) stays an index scan.
CREATE OR REPLACE FUNCTION stepready._holds_slot(p_state text, p_lease_expires_at timestamptz, p_as_of timestamptz)
RETURNS bool
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_state IN ('enqueued', 'in_progress') OR p_lease_expires_at >= p_as_of;
$$;

-- The earliest due time of a step made ready again while an orphaned lease of it (lease_expires_at, NULL: none)
-- may still run at p_as_of: the first instant the lease is expired. NULL when there is nothing to wait for.
CREATE OR REPLACE FUNCTION stepready._orphan_hold(p_lease_expires_at timestamptz, p_as_of timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_lease_expires_at >= p_as_of THEN p_lease_expires_at + interval '1 microsecond' END;
$$;

-- Ends the orphaned leases of the given entries (step p_step_ids[i], fencing token p_tokens[i]) whose token is
-- still the step's: the old worker reported after its attempt was taken away, so its handler has returned. The
-- slot is free at once, and a step held back until the lease's end (_orphan_hold) is due now. Entries without
-- such a lease change nothing. Called by the fenced calls for the entries they refused (rarely any: the hot path
-- never calls it). Returns how many leases ended. Rows are locked in ascending id.
CREATE OR REPLACE FUNCTION stepready._end_orphans(p_step_ids bigint[], p_tokens int[])
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    v_n int;
BEGIN
    UPDATE stepready.steps s
       SET lease_owner = NULL,
           lease_expires_at = NULL,
           next_attempt_at = CASE WHEN s.next_attempt_at = s.lease_expires_at + interval '1 microsecond'
                                  THEN NULL ELSE s.next_attempt_at END
      FROM (SELECT x.id, x.token FROM unnest(p_step_ids, p_tokens) AS x(id, token) ORDER BY x.id) u
     WHERE s.id = u.id AND s.fence_token = u.token AND s.lease_expires_at IS NOT NULL
       AND s.state NOT IN ('enqueued', 'in_progress');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
