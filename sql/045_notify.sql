-- Wake-ups: when a step becomes claimable and due now, daemons listening on `stepready_ready` are told which
-- task. Postgres folds identical notifications of one transaction into one, so a batch that readies many steps
-- of a task sends one message per task. The notification is only a hint: daemons also poll.
CREATE OR REPLACE FUNCTION stepready._claimable_now(p_state text, p_pending_parents int, p_task_held bool,
                                                    p_next_attempt_at timestamptz)
RETURNS bool
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT p_state IN ('pending', 'waiting_for_retry') AND p_pending_parents = 0 AND NOT p_task_held
       AND (p_next_attempt_at IS NULL OR p_next_attempt_at <= now());
$$;

-- Notifies each task of p_task_ids once. Called by the statement triggers of steps: steps_after_update (a step
-- that became claimable and due now by an update) and steps_notify (inserted steps).
CREATE OR REPLACE FUNCTION stepready._notify_ready(p_task_ids bigint[])
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('stepready_ready', u.task_id::text)
       FROM (SELECT DISTINCT x AS task_id FROM unnest(p_task_ids) AS x) u;
END;
$$;

-- Inserted steps that are claimable and due now: one notification per task per statement. (Updates are handled
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
