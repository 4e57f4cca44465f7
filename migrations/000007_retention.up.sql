BEGIN;

-- Retention (SPEC §13): prune_tasks finds the oldest finished tasks by completed_at. Only terminal tasks have
-- one, so the index holds finished work only and pruning reads O(batch) entries.
CREATE INDEX tasks_completed_at_idx ON stepready.tasks (completed_at, id) WHERE completed_at IS NOT NULL;

-- Tasks that finished before this version never had completed_at set for error or cancelled: take their last
-- update as the time they finished.
UPDATE stepready.tasks SET completed_at = updated_at
 WHERE status IN ('error', 'cancelled') AND completed_at IS NULL;

COMMIT;
