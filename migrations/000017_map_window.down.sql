-- Back to schema version 16: the window's index goes (the version-16 build's _map_release reads
-- steps_map_elements_idx).
BEGIN;

DROP INDEX IF EXISTS stepready.steps_map_window_idx;

COMMIT;
