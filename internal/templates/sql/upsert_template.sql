-- Stores a template as version 1, replacing the definition of an existing version 1 (the examples are edited in
-- place, not versioned). The task_templates trigger validates the definition and raises 22023/23514 naming the
-- field and step.
INSERT INTO stepready.task_templates (name, version, definition)
VALUES ($1, 1, $2)
ON CONFLICT (name, version) DO UPDATE SET definition = EXCLUDED.definition
