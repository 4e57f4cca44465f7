-- Every step of the given tasks, for the closing summary.
SELECT t.id, t.name, t.status, s.name, s.state, s.attempts, s.last_error ->> 'class', s.last_error ->> 'reason'
  FROM stepready.tasks t
  JOIN stepready.steps s ON s.task_id = t.id
 WHERE t.id = ANY ($1)
 ORDER BY t.id, s.id
