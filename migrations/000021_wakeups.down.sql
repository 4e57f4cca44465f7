-- Back to the version before 21: the wake-up counter goes (the builds before it notify inside the transaction).
BEGIN;

DROP SEQUENCE IF EXISTS stepready.wakeups;

COMMIT;
