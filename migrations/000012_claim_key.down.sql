-- Back to schema version 11. The claim function that uses the type goes with it, so that the version-11 build's
-- sql/ files, applied by its `migrate up`, create theirs.
BEGIN;

DROP FUNCTION IF EXISTS stepready._claim_flow_group(int, int, int, timestamptz, bigint[], text[], text, bool);
DROP TYPE IF EXISTS stepready._claim_key;

COMMIT;
