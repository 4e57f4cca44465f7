-- Back to schema version 14: the elements of map steps are deleted first (their map steps stay, as steps), then
-- the columns. The triggers whose functions read the map columns are dropped with them, so that nothing fires
-- against a column that is gone; the version-14 build's sql/ files, applied by its `migrate up`, create theirs
-- again (steps_after_update, steps_check_refs), as every down migration leaves it.
BEGIN;

DROP TRIGGER IF EXISTS steps_after_update ON stepready.steps;
DROP TRIGGER IF EXISTS steps_check_refs ON stepready.steps;
DROP FUNCTION IF EXISTS stepready._steps_check_refs();

DELETE FROM stepready.steps WHERE map_step_id IS NOT NULL;

ALTER TABLE stepready.steps
    DROP CONSTRAINT steps_element_shape,
    DROP COLUMN element_index,
    DROP COLUMN element,
    DROP COLUMN map_step_id,
    DROP COLUMN map_failed,
    DROP COLUMN map_done,
    DROP COLUMN map_total,
    DROP COLUMN map;

COMMIT;
