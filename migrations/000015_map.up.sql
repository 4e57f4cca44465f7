-- Schema version 15: map steps (SPEC §19). Elements are rows of stepready.steps (docs/design-core.md, "Map
-- steps").
--
-- On a map step: map (its definition's {over, max_in_flight, max_elements}; NULL for any other step), and once it
-- has fanned out map_total (its number of elements), map_done (elements complete or resolved by hand) and
-- map_failed (elements in error). On an element: map_step_id (its map step, same task), element (its array item)
-- and element_index (its position, from 0). Elements are deleted with their task (same task_id), like any step.
-- Adding nullable columns without a default rewrites nothing.
BEGIN;

ALTER TABLE stepready.steps
    ADD COLUMN map           jsonb CHECK (map IS NULL OR jsonb_typeof(map) = 'object'),
    ADD COLUMN map_total     int CHECK (map_total >= 0),
    ADD COLUMN map_done      int CHECK (map_done >= 0),
    ADD COLUMN map_failed    int CHECK (map_failed >= 0),
    ADD COLUMN map_step_id   bigint,
    ADD COLUMN element       jsonb,
    ADD COLUMN element_index int CHECK (element_index >= 0),
    ADD CONSTRAINT steps_element_shape CHECK ((map_step_id IS NULL) = (element_index IS NULL)
                                              AND (map_step_id IS NULL OR map IS NULL));

-- A map step's elements in element order: the aggregate output, the counts, the element list.
CREATE INDEX steps_map_elements_idx ON stepready.steps (map_step_id, element_index) WHERE map_step_id IS NOT NULL;

-- The claim asks whether the steps it picked hold a map step: answered from this small index, without reading the
-- picked rows again (a claim of steps that are not map steps finds no entry).
CREATE INDEX steps_maps_idx ON stepready.steps (id) WHERE map IS NOT NULL;

COMMIT;
