-- Every step of the given tasks, for the closing summary. A map step's elements are not listed: the map step
-- stands for them, with its progress (elements complete of its total).
SELECT t.id, t.name, t.status, s.name, s.state, s.attempts, s.last_error ->> 'class', s.last_error ->> 'reason',
       CASE WHEN s.map_total IS NOT NULL THEN format('%s of %s elements', s.map_done, s.map_total) END
  FROM stepready.tasks t
  JOIN stepready.steps s ON s.task_id = t.id
 WHERE t.id = ANY ($1) AND s.map_step_id IS NULL
 ORDER BY t.id, s.id
