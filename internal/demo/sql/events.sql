-- Events after the cursor, with the task and step names a reader needs. Identity values are handed out at
-- insert, not at commit, so a transaction that commits late can add an id below one already read: the caller
-- reads from the lowest id it may still be missing and skips the ones it has shown.
SELECT e.id, e.at, e.task_id, t.name, s.name, e.attempt, e.iteration, e.event, e.to_state, e.details
  FROM stepready.step_events e
  JOIN stepready.tasks t ON t.id = e.task_id
  LEFT JOIN stepready.steps s ON s.id = e.step_id
 WHERE e.id > $1
 ORDER BY e.id
 LIMIT 1000
