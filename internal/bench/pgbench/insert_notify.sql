-- The same INSERT with a NOTIFY in its transaction: PreCommit_Notify takes a cluster-wide lock held through the
-- commit's WAL flush, so these commits queue one behind the other.
BEGIN;
INSERT INTO bench_rows (v) VALUES (1);
SELECT pg_notify('bench', '1');
COMMIT;
