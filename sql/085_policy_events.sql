-- Outcome rules (SPEC §8) are evaluated in Go; this records what they decided, fenced like every other write
-- (p_attempt is the attempt's fencing token; a refused call with the step's own token ends the attempt's orphaned
-- lease, as complete_step does).
CREATE OR REPLACE FUNCTION stepready.record_policy_evaluation(
    p_step_id bigint, p_attempt int, p_details jsonb, p_as_of timestamptz DEFAULT now())
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    v stepready.steps;
BEGIN
    SELECT * INTO v FROM stepready.steps WHERE id = p_step_id FOR UPDATE;
    IF NOT FOUND OR v.state <> 'in_progress' OR v.fence_token IS DISTINCT FROM p_attempt THEN
        IF FOUND THEN
            PERFORM stepready._end_orphans(ARRAY[p_step_id], ARRAY[p_attempt]);
        END IF;
        RETURN false;
    END IF;
    PERFORM stepready._log(v, 'policy.evaluated', 'in_progress', NULL, COALESCE(p_details, '{}'), p_as_of);
    RETURN true;
END;
$$;
