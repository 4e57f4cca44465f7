-- Claiming ready steps (SPEC §6). Safe across any number of concurrent claimers.
CREATE OR REPLACE FUNCTION stepready.claim_ready_steps(
    p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    step_id    bigint,
    task_id    bigint,
    name       text,
    handler    text,
    input      jsonb,
    attempts   int,
    timeout_ms bigint,
    queue      text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_task_ids bigint[];
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'p_limit must be >= 0, got %', COALESCE(p_limit::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    PERFORM stepready._check_lease_args(p_worker, p_lease_ms);
    IF p_as_of IS NULL THEN
        RAISE EXCEPTION 'p_as_of must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF p_limit = 0 THEN
        RETURN;
    END IF;

    -- 1. Pick and lock the steps. Reads the partial index steps_claimable_idx: only rows whose parents are all
    --    satisfied and whose task is runnable are in it, so the work here follows the number of due candidates,
    --    not the table size. The full readiness rule is still re-checked on the rows (task status, pause,
    --    eligibility). FOR UPDATE OF s SKIP LOCKED locks the real step rows as they pass the LIMIT: a row locked
    --    by another claimer is skipped, and a row another claimer already moved on fails the re-checked WHERE, so
    --    concurrent claimers get disjoint sets.
    SELECT COALESCE(array_agg(c.id), '{}'), COALESCE(array_agg(DISTINCT c.task_id), '{}')
      INTO v_ids, v_task_ids
      FROM (
        SELECT s.id, s.task_id
          FROM stepready.steps s
          JOIN stepready.tasks t ON t.id = s.task_id
         -- The candidate ids come from the partial index alone, as an array, so the planner cannot choose to
         -- start from the tasks table and walk every step of every active task instead.
         WHERE s.id = ANY (ARRAY(
                   SELECT c.id FROM stepready.steps c
                    WHERE c.state IN ('pending', 'waiting_for_retry') AND c.pending_parents = 0
                      AND NOT c.task_held
                      AND COALESCE(c.next_attempt_at, '-infinity'::timestamptz) <= p_as_of))
           AND s.state IN ('pending', 'waiting_for_retry')
           AND s.pending_parents = 0
           AND NOT s.task_held
           AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
           AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
           AND t.status IN ('pending', 'in_progress')
           AND NOT t.paused
         ORDER BY t.priority DESC, s.priority DESC, s.next_attempt_at ASC NULLS FIRST, s.id
         LIMIT p_limit
           FOR UPDATE OF s SKIP LOCKED
      ) c;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;

    -- 2. Start the pending tasks, locking them in id order: locks are always taken steps first, then tasks in
    --    ascending id, so concurrent claimers (and operators, which follow the same order) cannot deadlock.
    --    NO KEY UPDATE, the lock an UPDATE of non-key columns takes anyway: FOR UPDATE would also block the
    --    key-share locks that the step_events foreign key takes on every task of this claim.
    UPDATE stepready.tasks t SET status = 'in_progress'
      FROM (SELECT id FROM stepready.tasks WHERE id = ANY (v_task_ids) AND status = 'pending'
             ORDER BY id FOR NO KEY UPDATE) p
     WHERE t.id = p.id;

    -- 3. Enqueue the steps with a lease and record it.
    RETURN QUERY
    WITH candidates AS (
        SELECT s.id, s.state AS from_state, t.priority AS task_priority
          FROM stepready.steps s
          JOIN stepready.tasks t ON t.id = s.task_id
         WHERE s.id = ANY (v_ids)
    ), claimed AS (
        UPDATE stepready.steps s
           SET state = 'enqueued',
               lease_owner = p_worker,
               lease_expires_at = p_as_of + p_lease_ms * interval '1 millisecond'
          FROM candidates c
         WHERE s.id = c.id
        RETURNING s.*, c.from_state, c.task_priority
    ), logged AS (
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT c.task_id, c.id, c.attempts, c.iteration, 'step.enqueued', c.from_state, 'enqueued',
               jsonb_build_object('worker', p_worker, 'lease_expires_at', c.lease_expires_at), p_as_of
          FROM claimed c
    )
    SELECT c.id, c.task_id, c.name, c.handler, c.input, c.attempts, c.timeout_ms, c.queue
      FROM claimed c
     ORDER BY c.task_priority DESC, c.priority DESC, c.next_attempt_at ASC NULLS FIRST, c.id;
END;
$$;

-- When the next claimable step becomes due after p_as_of (NULL: none is waiting on a backoff). Daemons set their
-- wake-up timer from it. Reads the claim index only; parents, pause and task status are already folded into it.
CREATE OR REPLACE FUNCTION stepready.next_claim_at(p_as_of timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT min(COALESCE(s.next_attempt_at, '-infinity'::timestamptz))
      FROM stepready.steps s
     WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
       AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) > p_as_of;
$$;
