-- Schema version 17: the window of map steps (max_in_flight) at the cost of the window, not of the map. Each
-- element that completes releases the next held ones (sql/058_map.sql, _map_release): it counts its map's slots
-- in use (released elements not yet terminal) and reads the first held elements in element order. Read through
-- steps_map_elements_idx, both walked every element of the map, finished ones included: O(map size) per
-- completion, which made a window over 10,000 elements finish ~60 of them a second (docs/design-core.md, "Map
-- steps").
--
-- This index holds only the elements not yet terminal, by map step, held (pending_parents = 1) or released (0),
-- then element order: the count reads the released range (at most max_in_flight entries), the release the
-- first entries of the held range. Steps that are not elements (map_step_id NULL) have no entry, and every
-- column of its predicate is already in another index's, so their updates stay as they were (HOT or not).
BEGIN;

CREATE INDEX steps_map_window_idx ON stepready.steps (map_step_id, pending_parents, element_index)
    WHERE map_step_id IS NOT NULL AND state NOT IN ('complete', 'error', 'skipped', 'cancelled', 'resolved_manually');

COMMIT;
