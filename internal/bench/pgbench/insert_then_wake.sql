-- The INSERT, then a NOTIFY in a transaction of its own with an asynchronous commit (stepready.wake_daemons'
-- recipe, uncoalesced: one wake-up per write, the worst case).
INSERT INTO bench_rows (v) VALUES (1);
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT pg_notify('bench', '1');
COMMIT;
