-- Schema version 14: data flow between steps (SPEC §18, issue 21).
--
-- steps.input_refs: whether the step's input holds the text `${` anywhere (a reference, sql/019_dataflow.sql).
-- Generated, so no writer can forget it: the start functions resolve the input of the rows where it is true and
-- hand every other input over as stored, and the plain-SQL path checks references at commit only for them.
-- Adding a stored generated column rewrites the steps table once (docs/upgrades.md).
--
-- stepready.settings: limits kept in the database, read by the SQL functions for every worker. One row now:
-- max_output_bytes, the largest output complete_step(s), continue_step and resolve_step accept (default 1 MiB).
BEGIN;

ALTER TABLE stepready.steps
    ADD COLUMN input_refs bool GENERATED ALWAYS AS (strpos(input::text, '${') > 0) STORED;

CREATE TABLE stepready.settings (
    name  text PRIMARY KEY,
    value jsonb NOT NULL,
    CONSTRAINT settings_known_name CHECK (name IN ('max_output_bytes')),
    CONSTRAINT settings_max_output_bytes CHECK (name <> 'max_output_bytes'
        OR (jsonb_typeof(value) = 'number' AND value::text ~ '^[0-9]+$' AND value::text::numeric BETWEEN 1 AND 1073741824))
);

INSERT INTO stepready.settings (name, value) VALUES ('max_output_bytes', '1048576');

COMMIT;
