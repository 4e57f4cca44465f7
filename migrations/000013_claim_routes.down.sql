-- Back to schema version 12. The claim functions that take the routing filters go with the index, so that the
-- version-12 build's sql/ files, applied by its `migrate up`, create theirs: left beside them, the new claim
-- functions (same names, two more parameters with defaults) would make every call of three or four arguments
-- ambiguous.
BEGIN;

DROP FUNCTION IF EXISTS stepready.claim_ready_steps(int, text, bigint, timestamptz, text[], text[]);
DROP FUNCTION IF EXISTS stepready.claim_and_start_steps(int, text, bigint, timestamptz, text[], text[]);
DROP FUNCTION IF EXISTS stepready._claim_begin(int, text, bigint, timestamptz, text[], text[]);
DROP FUNCTION IF EXISTS stepready._claim_pick_rows(int, timestamptz, text[], text[]);
DROP FUNCTION IF EXISTS stepready._claim_flow_group(int, int, int, timestamptz, text[], text[], bigint[], text[],
                                                    text, bool);
DROP FUNCTION IF EXISTS stepready._flow_next_rows(int, int, text, text, int, text[], text[]);
DROP FUNCTION IF EXISTS stepready._claim_routes(text[], text[]);
DROP FUNCTION IF EXISTS stepready._claim_route_range(int, int, int, timestamptz, text[], text[], bigint[], text[]);

DROP INDEX IF EXISTS stepready.steps_claim_route_idx;

COMMIT;
