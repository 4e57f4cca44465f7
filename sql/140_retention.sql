-- Retention (SPEC §13): deleting finished tasks, in bounded batches, without blocking anyone else's work.

-- Deletes at most p_limit tasks whose status is in p_statuses (terminal statuses only) and that finished before
-- p_finished_before, oldest first, with their steps, edges and events; returns how many it deleted.
--
-- Locking follows the one lock order of stepready, steps before tasks (docs/design-core.md), and never waits:
--   1. the oldest candidates are read without a lock;
--   2. every step of those tasks is locked with FOR UPDATE SKIP LOCKED, and a task keeps its place only when all
--      of its steps were locked here: a step held by someone else (an operator acting on the task, a late
--      result) leaves the task for the next round. So does a step that still holds a lease: an attempt that
--      may still run (in flight in a task that failed meanwhile, or orphaned by a cancel: sql/046_leases.sql)
--      keeps its task, and its concurrency slot, until it ends;
--   3. the tasks left are locked with FOR UPDATE SKIP LOCKED, which re-checks status and cut-off on the row's
--      newest version under the lock (a task reopened meanwhile by reset_task no longer qualifies).
-- The delete then cascades to steps this call holds. An operator locks a task's steps and then the task, so it
-- and the prune can never wait on each other in a cycle; and everything deleted belongs to finished tasks, whose
-- steps are outside the claim index: a claim of other tasks' steps locks none of these rows and waits on nothing
-- held here. A batch can come back short when tasks were skipped: the next round takes them.
--
-- Plans: sequential scans and hash or merge joins are off inside, so that the foreign-key cascades and the
-- statement triggers it fires look rows up by key whatever the statistics say (a plan made while the tables
-- were small would otherwise scan them whole on every batch).
CREATE OR REPLACE FUNCTION stepready.prune_tasks(p_finished_before timestamptz,
                                                 p_statuses text[] DEFAULT '{complete,cancelled}',
                                                 p_limit int DEFAULT 1000)
RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_bad  text;
    v_cand bigint[];
    v_keep bigint[];
    v_ids  bigint[];
BEGIN
    IF p_finished_before IS NULL THEN
        RAISE EXCEPTION 'prune_tasks: p_finished_before must not be NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM stepready._check_limit(p_limit, 'prune_tasks: ');
    SELECT s INTO v_bad FROM unnest(COALESCE(p_statuses, '{NULL}'::text[])) AS s
     WHERE s IS NULL OR s NOT IN ('complete', 'error', 'cancelled') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'prune_tasks: status %: only finished tasks are pruned (complete, error, cancelled)',
            COALESCE(quote_literal(v_bad), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_limit = 0 THEN
        RETURN 0;
    END IF;

    -- 1. Candidates, oldest first, not locked: tasks locked by someone else are skipped at step 3.
    SELECT array_agg(c.id ORDER BY c.id) INTO v_cand
      FROM (SELECT t.id FROM stepready.tasks t
             WHERE t.completed_at < p_finished_before AND t.status = ANY (p_statuses)
             ORDER BY t.completed_at, t.id
             LIMIT p_limit) c;
    IF v_cand IS NULL THEN
        RETURN 0;
    END IF;

    -- 2. Their steps first. `seen` counts each candidate's steps as this statement's snapshot has them, `got` the
    -- ones locked here (a step locked elsewhere is skipped, not waited for): a task whose counts differ, or
    -- with a step holding a lease, is left alone.
    WITH got AS (
        SELECT s.task_id, s.lease_expires_at IS NOT NULL AS leased
          FROM stepready.steps s
         WHERE s.task_id = ANY (v_cand)
         ORDER BY s.id
           FOR UPDATE SKIP LOCKED
    ), got_n AS (
        SELECT g.task_id, count(*) AS n, bool_or(g.leased) AS leased FROM got g GROUP BY g.task_id
    ), seen AS (
        SELECT s.task_id, count(*) AS n FROM stepready.steps s WHERE s.task_id = ANY (v_cand) GROUP BY s.task_id
    )
    SELECT array_agg(c.id ORDER BY c.id) INTO v_keep
      FROM unnest(v_cand) AS c(id)
      LEFT JOIN seen ON seen.task_id = c.id
      LEFT JOIN got_n ON got_n.task_id = c.id
     WHERE COALESCE(got_n.n, 0) = COALESCE(seen.n, 0) AND NOT COALESCE(got_n.leased, false);
    IF v_keep IS NULL THEN
        RETURN 0;
    END IF;

    -- 3. Then the tasks, re-checked under their lock.
    SELECT array_agg(t.id ORDER BY t.id) INTO v_ids
      FROM (SELECT t.id FROM stepready.tasks t
             WHERE t.id = ANY (v_keep) AND t.completed_at < p_finished_before AND t.status = ANY (p_statuses)
             ORDER BY t.id
               FOR UPDATE SKIP LOCKED) t;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;

    -- Events first, by the task index (step_events has no foreign keys: see sql/055_events.sql), then the tasks;
    -- their steps (locked above) go with them by ON DELETE CASCADE, and the steps' edges by a statement trigger
    -- (sql/030_edges.sql).
    DELETE FROM stepready.step_events WHERE task_id = ANY (v_ids);
    DELETE FROM stepready.tasks WHERE id = ANY (v_ids);
    RETURN cardinality(v_ids);
END;
$$;
