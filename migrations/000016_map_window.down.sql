-- Back to schema version 15: the window's index goes (the version-15 build's _map_release reads
-- steps_map_elements_idx).
BEGIN;

DROP INDEX IF EXISTS stepready.steps_map_window_idx;

COMMIT;
