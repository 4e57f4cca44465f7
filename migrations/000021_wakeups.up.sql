-- Schema version 21: wake-ups that do not serialise commits (issue 34). A transaction that makes a step
-- claimable now advances this sequence instead of sending NOTIFY; daemons read its last value (one page) every
-- probe interval and claim when it moved (sql/045_notify.sql, docs/design-core.md "Wake-ups"). A sequence,
-- because nextval is not transactional and holds its page only for the increment: concurrent writers never wait
-- for each other, where a NOTIFY takes one cluster-wide lock from before the commit until after its WAL flush.
-- CACHE 1 (the default) on purpose: with a cache, last_value would run ahead of the increments and a probe would
-- see nothing move.
BEGIN;

CREATE SEQUENCE stepready.wakeups AS bigint CACHE 1;

COMMIT;
