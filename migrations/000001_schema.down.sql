-- Drops everything stepready owns, functions and triggers included.
BEGIN;
DROP SCHEMA IF EXISTS stepready CASCADE;
COMMIT;
