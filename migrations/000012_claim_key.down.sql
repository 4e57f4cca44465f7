-- Back to schema version 11. The claim functions that use the type go with it, so that the version-11 build's
-- sql/ files, applied by its `migrate up`, create theirs (their _claim_flow_group keeps its state in arrays).
BEGIN;

DROP FUNCTION IF EXISTS stepready._claim_flow_keys(text[], bigint[], text[], timestamptz);
DROP FUNCTION IF EXISTS stepready._claim_flow_group(int, int, int, timestamptz, bigint[], text[], text, bool);
DROP TYPE IF EXISTS stepready._claim_key;

COMMIT;
