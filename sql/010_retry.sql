-- Retry eligibility and backoff: the pure functions every retry decision is built from (SPEC §4).

-- The first attempt is always allowed, whatever max_attempts and retryable say; after that only a retryable
-- step with attempts left. max_attempts counts every attempt, the first included.
CREATE OR REPLACE FUNCTION stepready.retry_eligible(p_attempts int, p_max_attempts int, p_retryable bool)
RETURNS bool
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT COALESCE(p_attempts, 0) = 0
        OR (COALESCE(p_retryable, true) AND p_attempts < COALESCE(p_max_attempts, 3));
$$;

-- Delay in ms before the attempt after attempt number p_attempt (1-based, the one that just failed).
-- Computed in log space so that no input overflows float8, numeric or bigint: a result above the cap (or above
-- 30 days when uncapped) is the cap.
CREATE OR REPLACE FUNCTION stepready.backoff_delay_ms(
    p_backoff text, p_attempt int, p_base_delay_ms bigint, p_multiplier float8, p_max_delay_ms bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    v_limit   bigint := CASE WHEN p_max_delay_ms IS NULL THEN 2592000000 -- 30 days
                              ELSE GREATEST(p_max_delay_ms, 0) END;
    v_attempt int    := GREATEST(COALESCE(p_attempt, 1), 1);
    v_base    bigint := GREATEST(COALESCE(p_base_delay_ms, 0), 0);
    v_mult    float8 := COALESCE(p_multiplier, 1);
    v_log     float8;
BEGIN
    IF p_backoff IS NULL OR p_backoff NOT IN ('none', 'fixed', 'linear', 'exponential') THEN
        RAISE EXCEPTION 'unknown backoff strategy %', COALESCE(quote_literal(p_backoff), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'backoff must be one of none, fixed, linear, exponential';
    END IF;
    IF v_base = 0 OR v_limit = 0 THEN
        RETURN 0;
    END IF;
    CASE p_backoff
        WHEN 'none', 'fixed' THEN
            RETURN LEAST(v_base, v_limit);
        WHEN 'linear' THEN
            RETURN LEAST(v_base::numeric * v_attempt, v_limit)::bigint;
        ELSE -- exponential
            IF v_mult <= 0 OR v_mult = 'NaN'::float8 THEN
                RETURN LEAST(v_base, v_limit);
            END IF;
            v_log := ln(v_base::float8) + (v_attempt - 1)::float8 * ln(v_mult);
            IF v_log > ln(v_limit::float8) + 1 THEN
                RETURN v_limit;
            ELSIF v_log < -1 THEN
                RETURN 0; -- a multiplier below 1 decayed the delay under a millisecond
            END IF;
            -- In range: compute directly so exact products (1000 × 2²) stay exact.
            RETURN LEAST(trunc(v_base::float8 * power(v_mult, (v_attempt - 1)::float8)), v_limit::float8)::bigint;
    END CASE;
END;
$$;

-- Jitter only shortens: delay × (1 − jitter × sample), truncated. The sample is drawn once per failure by the
-- caller and recorded, so a schedule can be replayed exactly.
CREATE OR REPLACE FUNCTION stepready._jittered_delay_ms(p_delay_ms bigint, p_jitter float8, p_sample float8)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN COALESCE(p_jitter, 0) <= 0 OR COALESCE(p_sample, 0) <= 0 THEN p_delay_ms
        ELSE trunc(p_delay_ms::numeric * (1 - LEAST(p_jitter, 1)::numeric * p_sample::numeric))::bigint
    END;
$$;

-- Circuit-breaker fingerprint: class plus the message with volatile parts collapsed, so "timeout after 31ms"
-- and "timeout after 29ms" count as the same failure. Hex runs containing a digit (ids, addresses, numbers) and
-- all-letter hex words of 8+ characters (hashes) become '#'.
CREATE OR REPLACE FUNCTION stepready._failure_fingerprint(p_class text, p_message text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_class || ':' || regexp_replace(lower(COALESCE(p_message, '')),
                                            '[0-9a-f]*[0-9][0-9a-f]*|\m[a-f]{8,}\M', '#', 'g');
$$;
