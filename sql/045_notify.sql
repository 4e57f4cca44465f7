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

CREATE OR REPLACE FUNCTION stepready._steps_notify()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND stepready._claimable_now(OLD.state, OLD.pending_parents, OLD.task_held, OLD.next_attempt_at) THEN
        RETURN NULL; -- was already claimable: whoever made it so has notified
    END IF;
    PERFORM pg_notify('stepready_ready', NEW.task_id::text);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER steps_notify
    AFTER INSERT OR UPDATE ON stepready.steps
    FOR EACH ROW
    WHEN (NEW.state IN ('pending', 'waiting_for_retry') AND NEW.pending_parents = 0 AND NOT NEW.task_held
          AND (NEW.next_attempt_at IS NULL OR NEW.next_attempt_at <= now()))
    EXECUTE FUNCTION stepready._steps_notify();
