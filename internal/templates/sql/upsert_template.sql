-- Stores a template under its name and version, replacing the definition of an existing row with the same name
-- and version (templates are edited in place unless their version changes). The task_templates trigger
-- validates the definition and raises 22023/23514 naming the field and step. Returns true when the row is new
-- (xmax is 0 only for a freshly inserted row version, not for one written by ON CONFLICT DO UPDATE).
INSERT INTO stepready.task_templates (name, version, definition)
VALUES ($1, $3, $2)
ON CONFLICT (name, version) DO UPDATE SET definition = EXCLUDED.definition
RETURNING (xmax = 0)
