-- The dependency graph: edge validation and the per-step count of unsatisfied parents that keeps claiming
-- O(ready steps).

-- A parent satisfies a dependency when it is complete, resolved by an operator, or skipped (SPEC §5).
CREATE OR REPLACE FUNCTION stepready._satisfies(p_state text)
RETURNS bool
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_state IN ('complete', 'resolved_manually', 'skipped');
$$;

-- Terminal states never change again on their own.
CREATE OR REPLACE FUNCTION stepready._is_terminal(p_state text)
RETURNS bool
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_state IN ('complete', 'error', 'skipped', 'cancelled', 'resolved_manually');
$$;

-- Rejects an edge whose steps do not exist (23503, as the foreign keys that step_edges no longer has), an edge
-- across tasks, a self-edge, and an edge that would close a cycle, naming both steps.
--
-- Every lookup here is by key, and must stay so whatever the statistics say. A row trigger's plans are made once
-- per session, for the first row: loading many edges in one statement into an empty (or unanalyzed) step_edges,
-- the planner saw a tiny table and chose a sequential scan with a hash join for the reachability walk, and then
-- every later row scanned all the edges inserted before it (quadratic: 900,000 edges did not finish in 30
-- minutes). Sequential scans and hash or merge joins are therefore off inside this function.
CREATE OR REPLACE FUNCTION stepready._step_edges_validate()
RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    p stepready.steps;
    c stepready.steps;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'step_edges rows cannot be updated: delete the edge and insert a new one'
            USING ERRCODE = '0A000';
    END IF;
    -- Both steps are locked against deletion until the edge commits (KEY SHARE, what a foreign key takes:
    -- step_edges has none since schema version 11).
    SELECT * INTO p FROM stepready.steps WHERE id = NEW.parent_step_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'edge % -> %: parent step % does not exist', NEW.parent_step_id, NEW.child_step_id,
            NEW.parent_step_id USING ERRCODE = '23503';
    END IF;
    SELECT * INTO c FROM stepready.steps WHERE id = NEW.child_step_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'edge "%" -> %: child step % does not exist', p.name, NEW.child_step_id,
            NEW.child_step_id USING ERRCODE = '23503';
    END IF;
    IF p.id = c.id THEN
        RAISE EXCEPTION 'edge "%" -> "%" (task %): a step cannot depend on itself', p.name, c.name, p.task_id
            USING ERRCODE = '23514';
    END IF;
    IF p.task_id <> c.task_id THEN
        RAISE EXCEPTION 'edge "%" (task %) -> "%" (task %): both steps must belong to the same task',
            p.name, p.task_id, c.name, c.task_id USING ERRCODE = '23514';
    END IF;
    -- Serialize edge changes per task so two transactions cannot each add half of a cycle.
    PERFORM 1 FROM stepready.tasks WHERE id = p.task_id FOR NO KEY UPDATE;
    IF EXISTS (
        WITH RECURSIVE reach(id) AS (
            SELECT e.child_step_id FROM stepready.step_edges e WHERE e.parent_step_id = c.id
            UNION
            SELECT e.child_step_id FROM stepready.step_edges e JOIN reach r ON e.parent_step_id = r.id
        )
        SELECT 1 FROM reach WHERE id = p.id
    ) THEN
        RAISE EXCEPTION 'edge "%" -> "%" (task %) would close a dependency cycle', p.name, c.name, p.task_id
            USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END;
$$;

-- Not called for the edges of create_tasks: its set-based validation has checked every DAG of the call (names,
-- references, cycles) before writing, and its steps belong to tasks nobody else can see yet
-- (sql/018_validated_write.sql).
DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE OR REPLACE TRIGGER step_edges_validate
    BEFORE INSERT OR UPDATE ON stepready.step_edges
    FOR EACH ROW WHEN (NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._step_edges_validate()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;

-- Keeps steps.pending_parents equal to the number of unsatisfied parents as edges come and go. Once per
-- statement: a fan-in of N parents updates its child once, not N times.
--
-- Every join here is by key, and must stay so whatever the statistics say: the transition table has none, and
-- on a freshly created (never analyzed) database the planner took steps for a tiny table and joined it by a
-- sequential scan, so creating a task cost more with every task already in the table (2.7 ms per 4-step chain
-- at first, 12 ms after 40 s). Sequential scans and hash or merge joins are off inside this function; once per
-- statement, that costs a few microseconds.
CREATE OR REPLACE FUNCTION stepready._step_edges_count()
RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE stepready.steps s
           SET pending_parents = s.pending_parents + d.cnt
          FROM (SELECT e.child_step_id, count(*)::int AS cnt
                  FROM changed_edges e
                  JOIN stepready.steps p ON p.id = e.parent_step_id
                 WHERE NOT stepready._satisfies(p.state)
                 GROUP BY e.child_step_id) d
         WHERE s.id = d.child_step_id;
    ELSE
        -- Recount instead of decrementing: when the parent step itself is being deleted, its row (and so its
        -- state) is already gone. Children deleted in the same statement simply match no row.
        UPDATE stepready.steps s
           SET pending_parents = (SELECT count(*) FROM stepready.step_edges e
                                    JOIN stepready.steps p ON p.id = e.parent_step_id
                                   WHERE e.child_step_id = s.id AND NOT stepready._satisfies(p.state))
         WHERE s.id IN (SELECT child_step_id FROM changed_edges);
    END IF;
    RETURN NULL;
END;
$$;

-- create_tasks writes its steps with their pending_parents already counted, and its edges skip this trigger
-- (sql/018_validated_write.sql): the children are not updated a second time.
DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE OR REPLACE TRIGGER step_edges_count_inserted
    AFTER INSERT ON stepready.step_edges
    REFERENCING NEW TABLE AS changed_edges
    FOR EACH STATEMENT WHEN (NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._step_edges_count()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;

CREATE OR REPLACE TRIGGER step_edges_count_deleted
    AFTER DELETE ON stepready.step_edges
    REFERENCING OLD TABLE AS changed_edges
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._step_edges_count();

-- Deleted steps take their edges along, as ON DELETE CASCADE did before schema version 11 (step_edges has no
-- foreign keys: see migrations/000011_edges_without_foreign_keys.up.sql): once per statement, both directions by
-- index (the primary key leads with the parent, step_edges_child_idx with the child). Deleting the edges fires
-- step_edges_count_deleted, which recounts the pending parents of the children that remain. A TRUNCATE of steps
-- empties step_edges.
CREATE OR REPLACE FUNCTION stepready._steps_delete_edges()
RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM stepready.step_edges;
        RETURN NULL;
    END IF;
    DELETE FROM stepready.step_edges e USING gone g WHERE e.parent_step_id = g.id;
    DELETE FROM stepready.step_edges e USING gone g WHERE e.child_step_id = g.id;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER steps_delete_edges
    AFTER DELETE ON stepready.steps
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._steps_delete_edges();

CREATE OR REPLACE TRIGGER steps_truncate_edges
    AFTER TRUNCATE ON stepready.steps
    FOR EACH STATEMENT EXECUTE FUNCTION stepready._steps_delete_edges();

-- When a parent's satisfaction changes, so does every child's count: the statement trigger steps_after_update
-- (sql/040_task_status.sql) applies it, once per statement. The row trigger of earlier versions goes.
DROP TRIGGER IF EXISTS steps_propagate_to_children ON stepready.steps;
DROP FUNCTION IF EXISTS stepready._steps_propagate_to_children();
