-- Wake-ups (docs/design-core.md, "Wake-ups"). When a step becomes claimable and due now, the daemons must learn
-- it. They are told in two ways, neither of which makes one writer's commit wait for another's:
--   * In the writing transaction, _notify_ready advances the sequence stepready.wakeups (one nextval per
--     statement). Daemons and workers read its last value with wake_count() every probe interval (one page) and
--     claim when it moved. No NOTIFY here: PostgreSQL (async.c, PreCommit_Notify) takes a cluster-wide lock at
--     the commit of every transaction that notified and holds it through the commit's WAL flush, so with
--     synchronous_commit on every notifying commit in the cluster waited for the one before it and none shared an
--     fsync (pgbench, 10 clients, durable server: INSERT ~2,500 tps, INSERT + pg_notify ~450 tps). nextval holds
--     the sequence's page for the increment alone and is not transactional.
--   * After the commit, whoever wrote sends pg_notify('stepready_ready', task_id) in a transaction of its own
--     with synchronous_commit off (wake_daemons): the Go library does so, coalesced, after every creation,
--     signal and operator action it committed itself, so daemons listening on the channel start at once. That
--     transaction holds the notify lock for the commit alone, not for an fsync.
-- Both are hints: a daemon also polls, and a claim re-checks readiness.
CREATE OR REPLACE FUNCTION stepready._claimable_now(p_state text, p_pending_parents int, p_task_held bool,
                                                    p_next_attempt_at timestamptz)
RETURNS bool
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT p_state IN ('pending', 'waiting_for_retry') AND p_pending_parents = 0 AND NOT p_task_held
       AND (p_next_attempt_at IS NULL OR p_next_attempt_at <= now());
$$;

-- Tells the daemons that steps of the tasks p_task_ids became claimable: one increment of stepready.wakeups,
-- whatever the number of tasks (the tasks are kept in the signature for the callers' sake: the counter carries no
-- payload). Called by the statement triggers of steps (steps_after_update, steps_notify), create_tasks, the map
-- fan-out, run_at changes and a claim that passed over keys held by another claim.
-- PL/pgSQL, not SQL: a SQL function called from PL/pgSQL is not inlined and is parsed and planned again at every
-- call (measured: 250 µs a call under load, against 17 µs for the nextval it runs); PL/pgSQL keeps its plan.
DROP FUNCTION IF EXISTS stepready._notify_ready(bigint[]);
-- The sequence is looked up by name at each call (one catalog cache probe), not named in the statement: the
-- functions of this directory also serve a schema migrated down below version 21 (the migrations' tests create
-- tasks there), which has no counter to advance.
CREATE OR REPLACE FUNCTION stepready._notify_ready(p_task_ids bigint[])
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_seq regclass := pg_catalog.to_regclass('stepready.wakeups');
BEGIN
    IF v_seq IS NOT NULL THEN
        PERFORM pg_catalog.nextval(v_seq);
    END IF;
END;
$$;

-- The wake-up counter's current value, read by daemons and workers every probe interval: when it differs from the
-- value they read before, something became claimable since (or is about to be, for a transaction that has not
-- committed yet: a daemon claims again a little later, see docs/workers.md). One read of the sequence's page;
-- not transactional, not MVCC.
CREATE OR REPLACE FUNCTION stepready.wake_count()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    -- Until the first nextval, last_value is the start value with is_called false: count it as one less, so
    -- the first increment moves the count too.
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM stepready.wakeups s;
$$;

-- Wakes the daemons listening on stepready_ready now: call it after COMMIT, in a transaction of its own (the Go
-- library does, after the creations, signals and operator actions it commits itself). The payload is p_task_id
-- (0 when it is NULL: "some task"). In a transaction that has written nothing, its commit is made asynchronous
-- (synchronous_commit off for this transaction only): it writes nothing that must survive a crash, so its commit
-- holds PostgreSQL's notify lock without waiting for the WAL flush, and concurrent callers do not queue behind
-- each other's fsync. Called inside a transaction that has written (an XID is assigned), it leaves the commit
-- durable and the transaction pays the notify lock as any NOTIFY does.
CREATE OR REPLACE FUNCTION stepready.wake_daemons(p_task_id bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM pg_catalog.pg_notify('stepready_ready', COALESCE(p_task_id, 0)::text);
END;
$$;

-- Inserted steps that are claimable and due now: one wake-up per statement. (Updates are handled
-- by steps_after_update, which compares each row with its previous version.)
CREATE OR REPLACE FUNCTION stepready._steps_notify()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_tasks bigint[];
BEGIN
    SELECT array_agg(DISTINCT n.task_id) INTO v_tasks
      FROM new_rows n
     WHERE n.wait IS NULL -- a wait step is never claimable (SPEC §20): it starts waiting at commit
       AND stepready._claimable_now(n.state, n.pending_parents, n.task_held, n.next_attempt_at);
    IF v_tasks IS NOT NULL THEN
        PERFORM stepready._notify_ready(v_tasks);
    END IF;
    RETURN NULL;
END;
$$;

-- create_tasks notifies the tasks it creates itself (sql/018_validated_write.sql).
DO $trigger$ BEGIN EXECUTE replace($sql$
CREATE OR REPLACE TRIGGER steps_notify
    AFTER INSERT ON stepready.steps
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (NOT stepready._validated_write())
    EXECUTE FUNCTION stepready._steps_notify()
$sql$, 'stepready._validated_write()', stepready._validated_write_sql()); END $trigger$;
