-- One task from the newest version of the template, with the template's own context.
SELECT stepready.create_task_from_template($1, '{}'::jsonb)
