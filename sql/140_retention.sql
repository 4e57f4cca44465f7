-- Retention (SPEC §13): deleting finished tasks, in bounded batches, without blocking anyone else's work.

-- Deletes at most p_limit tasks whose status is in p_statuses (terminal statuses only) and that finished before
-- p_finished_before, oldest first, with their steps, edges and events; returns how many it deleted.
--
-- Locking: the tasks are picked with FOR UPDATE SKIP LOCKED, which re-checks status and cut-off on the row's
-- newest version under the lock (a task reopened meanwhile by reset_task no longer qualifies) and never waits:
-- a task locked by someone else is left for the next round. Everything deleted belongs to those tasks, whose
-- steps are terminal and so outside the claim index: a claim of other tasks' steps locks none of these rows and
-- waits on nothing held here.
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
    v_bad text;
    v_ids bigint[];
BEGIN
    IF p_finished_before IS NULL THEN
        RAISE EXCEPTION 'prune_tasks: p_finished_before must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'prune_tasks: p_limit must be >= 0, got %', COALESCE(p_limit::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    SELECT s INTO v_bad FROM unnest(COALESCE(p_statuses, '{NULL}'::text[])) AS s
     WHERE s IS NULL OR s NOT IN ('complete', 'error', 'cancelled') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'prune_tasks: status %: only finished tasks are pruned (complete, error, cancelled)',
            COALESCE(quote_literal(v_bad), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_limit = 0 THEN
        RETURN 0;
    END IF;

    SELECT array_agg(t.id ORDER BY t.id) INTO v_ids
      FROM (SELECT id FROM stepready.tasks
             WHERE completed_at < p_finished_before AND status = ANY (p_statuses)
             ORDER BY completed_at, id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED) t;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;

    -- Events first, by the task index (step_events has no foreign keys: see sql/055_events.sql), then the tasks;
    -- their steps go with them by ON DELETE CASCADE, and the steps' edges by a statement trigger (sql/030_edges.sql).
    DELETE FROM stepready.step_events WHERE task_id = ANY (v_ids);
    DELETE FROM stepready.tasks WHERE id = ANY (v_ids);
    RETURN cardinality(v_ids);
END;
$$;
