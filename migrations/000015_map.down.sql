-- Back to schema version 14: the elements of map steps are deleted first (their map steps stay, as steps).
BEGIN;

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
