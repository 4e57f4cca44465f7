-- Back to the schema before version 11: step_edges references both of its steps again (edges whose steps are
-- gone, which the keys would have deleted with them, are deleted first), and the statement triggers that stood
-- in for the keys' ON DELETE CASCADE go (an older release's functions do not know them).
BEGIN;

DROP TRIGGER IF EXISTS steps_delete_edges ON stepready.steps;
DROP TRIGGER IF EXISTS steps_truncate_edges ON stepready.steps;
DROP FUNCTION IF EXISTS stepready._steps_delete_edges();
DELETE FROM stepready.step_edges e
 WHERE NOT EXISTS (SELECT 1 FROM stepready.steps s WHERE s.id = e.parent_step_id)
    OR NOT EXISTS (SELECT 1 FROM stepready.steps s WHERE s.id = e.child_step_id);
ALTER TABLE stepready.step_edges
    ADD CONSTRAINT step_edges_parent_step_id_fkey
        FOREIGN KEY (parent_step_id) REFERENCES stepready.steps (id) ON DELETE CASCADE,
    ADD CONSTRAINT step_edges_child_step_id_fkey
        FOREIGN KEY (child_step_id) REFERENCES stepready.steps (id) ON DELETE CASCADE;

COMMIT;
