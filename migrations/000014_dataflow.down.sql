-- Reverts schema version 14 (data flow): the settings table and steps.input_refs. The functions of
-- sql/017_dataflow.sql that read them are dropped first.
BEGIN;

DROP TRIGGER IF EXISTS steps_check_refs ON stepready.steps;
DROP FUNCTION IF EXISTS stepready._steps_check_refs();
DROP FUNCTION IF EXISTS stepready._max_output_bytes();
DROP FUNCTION IF EXISTS stepready._check_output_size(bigint, jsonb);
DROP TABLE IF EXISTS stepready.settings;
ALTER TABLE stepready.steps DROP COLUMN IF EXISTS input_refs;

COMMIT;
