-- Flow control in the claim (SPEC §14; docs/design-core.md, "Flow control"): how _claim_pick_rows (060_claim.sql)
-- serves a (task priority, step priority) group whose claimable rows have fairness keys. The rules it applies
-- (the count of slots taken, the limit rule, the token bucket) are those of 047_flow.sql, shared with readiness,
-- explain and flow_status.
--
-- A claim walks the group's keys as a ring, one step per key in the first round, starting after the key the
-- previous claim served last (flow_cursor); later rounds share what is left evenly among the keys that still
-- gave. Before it reads a key's limits it locks the key's flow_state row, and counts the key's slots in a
-- statement of its own: a key never has more than its limit in flight, not even for an instant, whatever the
-- number of concurrent claims. The state of each key met (what was read when it was locked, what the claim took
-- and decided since) is one stepready._claim_key (schema version 12).

-- The keys of the claimable rows of one (task priority, step priority) group in ring order after p_after (NULL:
-- from the start), at most p_max, '' (steps without a key) first in key order, with the id of each key's first
-- claimable row in claim order (due time, then id) as the probe found it: the claim tries that row first, by
-- its primary key, before it reads the key's range again. Each key is one probe of steps_claim_order_idx (a
-- loose index scan): the cost follows the keys returned, not the rows behind them. A routed claim (p_rq/p_rh,
-- _claim_routes in 060_claim.sql) sees only its routes' rows: each probe is one probe of steps_claim_route_idx
-- per route, the next key the least of their answers.
DROP FUNCTION IF EXISTS stepready._flow_next_keys(int, int, text, text, int); -- before it returned the keys only
DROP FUNCTION IF EXISTS stepready._flow_next_rows(int, int, text, text, int); -- before routing
CREATE OR REPLACE FUNCTION stepready._flow_next_rows(p_tp int, p_p int, p_after text, p_upto text, p_max int,
                                                     p_rq text[], p_rh text[],
                                                     OUT p_keys text[], OUT p_ids bigint[])
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Each probe must walk steps_claim_order_idx (steps_claim_route_idx) from the previous key: a plan that reads the
-- claimable rows of another index and sorts them costs O(claimable rows) per key (measured: 600 ms for a claim of
-- 1,000 keys).
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_after text := p_after;
    v_id    bigint;
BEGIN
    p_keys := '{}';
    p_ids := '{}';
    IF v_after IS NULL THEN
        -- From the start of the ring: '' (the steps without a key) sorts first.
        IF p_rq IS NULL THEN
            SELECT s.flow_key, s.id INTO v_after, v_id FROM stepready.steps s
             WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
               AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key >= ''
             ORDER BY s.flow_key, COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id LIMIT 1;
        ELSE
            SELECT x.flow_key, x.id INTO v_after, v_id
              FROM unnest(p_rq, p_rh) AS r(q, h)
             CROSS JOIN LATERAL (
                   SELECT s.flow_key, GREATEST(s.next_attempt_at, '-infinity'::timestamptz) AS due, s.id
                     FROM stepready.steps s
                    WHERE s.queue = r.q AND s.handler = r.h
                      AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                      AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key >= ''
                    ORDER BY s.queue, s.handler, s.task_priority, s.priority, s.flow_key,
                             GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id
                    LIMIT 1) x
             ORDER BY x.flow_key, x.due, x.id LIMIT 1;
        END IF;
        IF v_after IS NULL OR v_after > p_upto THEN
            RETURN;
        END IF;
        p_keys := ARRAY[v_after];
        p_ids := ARRAY[v_id];
    END IF;
    IF cardinality(p_keys) >= p_max THEN
        RETURN;
    END IF;
    -- One probe per key (per route and key, routed): each finds the first row of the smallest key after the
    -- previous one.
    IF p_rq IS NULL THEN
        SELECT p_keys || COALESCE(array_agg(x.key ORDER BY x.n), '{}'), p_ids || COALESCE(array_agg(x.id ORDER BY x.n), '{}')
          INTO p_keys, p_ids
          FROM (WITH RECURSIVE k(key, id, n) AS (
                    SELECT r.flow_key, r.id, 1
                      FROM (SELECT s.flow_key, s.id FROM stepready.steps s
                             WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                               AND NOT s.task_held AND s.task_priority = p_tp AND s.priority = p_p
                               AND s.flow_key > v_after
                             ORDER BY s.flow_key, COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id
                             LIMIT 1) r
                    UNION ALL
                    SELECT r.flow_key, r.id, k.n + 1
                      FROM k
                     CROSS JOIN LATERAL (
                           SELECT s.flow_key, s.id FROM stepready.steps s
                            WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                              AND NOT s.task_held AND s.task_priority = p_tp AND s.priority = p_p
                              AND s.flow_key > k.key
                            ORDER BY s.flow_key, COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id
                            LIMIT 1) r
                     WHERE k.n < p_max - cardinality(p_keys)
                       AND (p_upto IS NULL OR k.key < p_upto))
                SELECT k.key, k.id, k.n FROM k WHERE p_upto IS NULL OR k.key <= p_upto) x;
    ELSE
        SELECT p_keys || COALESCE(array_agg(x.key ORDER BY x.n), '{}'), p_ids || COALESCE(array_agg(x.id ORDER BY x.n), '{}')
          INTO p_keys, p_ids
          FROM (WITH RECURSIVE k(key, id, n) AS (
                    SELECT m.flow_key, m.id, 1
                      FROM (SELECT y.flow_key, y.id
                              FROM unnest(p_rq, p_rh) AS r(q, h)
                             CROSS JOIN LATERAL (
                                   SELECT s.flow_key, GREATEST(s.next_attempt_at, '-infinity'::timestamptz) AS due, s.id
                                     FROM stepready.steps s
                                    WHERE s.queue = r.q AND s.handler = r.h
                                      AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                      AND NOT s.task_held AND s.task_priority = p_tp AND s.priority = p_p
                                      AND s.flow_key > v_after
                                    ORDER BY s.queue, s.handler, s.task_priority, s.priority, s.flow_key,
                                             GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id
                                    LIMIT 1) y
                             ORDER BY y.flow_key, y.due, y.id LIMIT 1) m
                    UNION ALL
                    SELECT m.flow_key, m.id, k.n + 1
                      FROM k
                     CROSS JOIN LATERAL (
                           SELECT y.flow_key, y.id
                             FROM unnest(p_rq, p_rh) AS r(q, h)
                            CROSS JOIN LATERAL (
                                  SELECT s.flow_key, GREATEST(s.next_attempt_at, '-infinity'::timestamptz) AS due, s.id
                                    FROM stepready.steps s
                                   WHERE s.queue = r.q AND s.handler = r.h
                                     AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                     AND NOT s.task_held AND s.task_priority = p_tp AND s.priority = p_p
                                     AND s.flow_key > k.key
                                   ORDER BY s.queue, s.handler, s.task_priority, s.priority, s.flow_key,
                                            GREATEST(s.next_attempt_at, '-infinity'::timestamptz), s.id
                                   LIMIT 1) y
                            ORDER BY y.flow_key, y.due, y.id LIMIT 1) m
                     WHERE k.n < p_max - cardinality(p_keys)
                       AND (p_upto IS NULL OR k.key < p_upto))
                SELECT k.key, k.id, k.n FROM k WHERE p_upto IS NULL OR k.key <= p_upto) x;
    END IF;
END;
$$;

-- Locks the flow_state rows of p_keys ('' excluded), creating those never claimed before, and returns the keys
-- locked. The first keys of a claim (p_have_locks false) wait for their locks, taken in key order so that claims
-- never deadlock with each other; a claim that already holds keys never waits again: a key held by another
-- claim, or not created yet, is left out.
CREATE OR REPLACE FUNCTION stepready._claim_flow_lock(p_keys text[], p_have_locks bool)
RETURNS text[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_keys text[];
    v_got  text[];
BEGIN
    SELECT array_agg(k ORDER BY k) INTO v_keys FROM unnest(p_keys) k WHERE k <> '';
    IF v_keys IS NULL THEN
        RETURN '{}';
    END IF;
    IF NOT p_have_locks THEN
        INSERT INTO stepready.flow_state (key)
        SELECT k FROM unnest(v_keys) k
         WHERE NOT EXISTS (SELECT 1 FROM stepready.flow_state f WHERE f.key = k)
         ORDER BY k
        ON CONFLICT (key) DO NOTHING;
        SELECT array_agg(f.key) INTO v_got
          FROM (SELECT f.key FROM stepready.flow_state f WHERE f.key = ANY (v_keys) ORDER BY f.key FOR UPDATE) f;
    ELSE
        SELECT array_agg(f.key) INTO v_got
          FROM (SELECT f.key FROM stepready.flow_state f WHERE f.key = ANY (v_keys) ORDER BY f.key
                   FOR UPDATE SKIP LOCKED) f;
    END IF;
    RETURN COALESCE(v_got, '{}');
END;
$$;

-- Takes one token of a rate key that is not the fairness key of the step claiming it (a step with both a
-- concurrency key and a different rate key). Never waits: false when another claim holds the key or it has no
-- token now (then its wake-up time is recorded). The limit rule is _flow_refusal's, with the key's override.
CREATE OR REPLACE FUNCTION stepready._claim_flow_other_token(p_key text, p_limit int, p_period_ms bigint,
                                                             p_as_of timestamptz)
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    f     stepready.flow_state;
    v_lim int;
    v_per bigint;
BEGIN
    SELECT * INTO f FROM stepready.flow_state WHERE key = p_key FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        INSERT INTO stepready.flow_state (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING RETURNING * INTO f;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
    END IF;
    SELECT COALESCE(l.rate_limit, p_limit), COALESCE(l.rate_period_ms, p_period_ms) INTO v_lim, v_per
      FROM (SELECT 1) one LEFT JOIN stepready.flow_limits l ON l.key = p_key;
    IF stepready._flow_refusal(NULL, NULL, f.rate_tat, v_lim, v_per, p_as_of) IS NOT NULL THEN
        UPDATE stepready.flow_state SET wake_at = stepready._flow_next_token(f.rate_tat, v_lim, v_per, p_as_of)
         WHERE key = p_key;
        RETURN false;
    END IF;
    UPDATE stepready.flow_state
       SET rate_tat = (stepready._flow_tokens(f.rate_tat, v_lim, v_per, p_as_of, 1)).p_new_tat, wake_at = NULL,
           rate_limit = p_limit, rate_period_ms = p_period_ms
     WHERE key = p_key;
    RETURN true;
END;
$$;

-- One (task priority, step priority) group with keyed rows. Adds up to p_limit - cardinality(p_ids) rows to
-- p_ids/p_states, round-robin across the group's fairness keys ('' standing for the steps without a key, which
-- has no limit): the first round takes one step per key in ring order, starting after p_cursor (the key the
-- previous claim served last) and wrapping around; later rounds share what is left evenly among the keys that
-- still gave. p_cursor comes back as the last key served in the first round.
--
-- Limits: each key's flow_state row is locked before its limits are read; the first keys of a claim wait for
-- their locks (taken in key order, so claims never deadlock with each other), keys found later are skipped when
-- another claim holds them (the claim then notifies, so the skipped steps are claimed right after). With the lock
-- held, the key's slots are counted (_flow_in_flight_keys) in a statement of its own, which sees every claim
-- committed before ours. Each step is then taken or refused by _flow_refusal, the limit rule readiness and
-- flow_status apply, with what the claim took before it counted in: rate limits take one token per step
-- (_flow_tokens); a key left with claimable steps and no token records when the next token arrives (wake_at, read
-- by next_flow_at).
--
-- A routed claim (p_rq/p_rh: _claim_routes in 060_claim.sql) walks the ring of the keys its routes have rows
-- of, and reads each key's rows of those routes merged in claim order (due time, id); it locks only the rows it
-- takes. Limits and fairness are the key's whatever the routes: the slots counted are all the key's steps in
-- flight, whichever claimer took them.
DROP FUNCTION IF EXISTS stepready._claim_flow_group(int, int, int, timestamptz, bigint[], text[], text, bool);
CREATE OR REPLACE FUNCTION stepready._claim_flow_group(
    p_tp int, p_p int, p_limit int, p_as_of timestamptz, p_rq text[], p_rh text[],
    INOUT p_ids bigint[], INOUT p_states text[], INOUT p_cursor text, INOUT p_locked bool)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Every per-key read is an index probe (steps_claim_order_idx, steps_in_flight_key_idx, flow_state's key): never a
-- plan that reads a whole index or table once statistics make the tables look small.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    k          stepready._claim_key[] := '{}';  -- every key met in this group, in ring order
    ks         stepready._claim_key;            -- the key of the rows being decided (k[v_cur], written back)
    v_cur      int;
    v_want     int := p_limit - cardinality(p_ids);
    v_round1   bool := true;
    v_after    text := p_cursor;   -- round 1: keys after this one...
    v_upto     text;               -- ...and up to this one (after wrapping around)
    v_wrapped  bool := p_cursor IS NULL;
    v_batch    text[];
    v_first    bigint[];           -- the first claimable row of each key of v_batch, as its probe found it
    v_got      text[];
    v_visit    int[];              -- the keys of one pass, as positions in k
    v_prod     int[] := '{}';      -- keys that gave all a pass asked and may give more
    v_n        int;
    v_q        int;
    v_skipped  bool := false;
    v_last     text;
    r          record;
    v_why      text;
    v_c_lim    int;
    v_r_lim    int;
    v_per      bigint;
BEGIN
    IF v_wrapped THEN
        v_after := NULL;
    END IF;
    LOOP
        EXIT WHEN v_want <= 0;
        IF v_round1 THEN
            -- Round 1: the next keys in ring order, one step each.
            SELECT n.p_keys, n.p_ids INTO v_batch, v_first
              FROM stepready._flow_next_rows(p_tp, p_p, v_after, v_upto, GREATEST(v_want, 16), p_rq, p_rh) n;
            IF cardinality(v_batch) = 0 THEN
                IF v_wrapped THEN
                    v_round1 := false;
                ELSE
                    v_wrapped := true;
                    v_after := NULL;
                    v_upto := p_cursor;
                END IF;
                CONTINUE;
            END IF;
            v_after := v_batch[cardinality(v_batch)];
            IF v_wrapped AND v_after >= p_cursor THEN
                v_round1 := false; -- the ring is done after this batch
            END IF;
            v_q := 1;
            v_got := stepready._claim_flow_lock(v_batch, p_locked);
            p_locked := p_locked OR cardinality(v_got) > 0;
            v_skipped := v_skipped OR cardinality(v_got) < cardinality(array_remove(v_batch, ''));
            -- The keys locked (and '' when in the batch), appended in ring order: a batch is in key order.
            v_n := cardinality(k);
            k := k || stepready._claim_flow_keys(v_batch, v_first, v_got, p_as_of);
            v_visit := ARRAY(SELECT generate_series(v_n + 1, cardinality(k)));
        ELSE
            -- Later rounds: what is left, shared among the keys that gave and may give more.
            EXIT WHEN cardinality(v_prod) = 0;
            v_q := ceil(v_want::numeric / cardinality(v_prod))::int;
            v_visit := v_prod;
            v_prod := '{}';
        END IF;

        -- The next v_q due rows of every key of the pass, after where the key was left, in ring order (so each
        -- key's rows come together). While nothing has been taken from a key (its first visit, in round 1: one
        -- row wanted) the row its probe found is tried first by its primary key: when it is due, eligible and
        -- not locked it is exactly the row the range would give (the key's first in claim order), and the range is
        -- not read at all (the LIMIT stops the UNION ALL after it). Routed, the range is the key's first rows of
        -- each route (unlocked), merged in claim order; only the rows taken are locked. One of the two branches
        -- runs, the other is cut off by its constant filter (p_rq IS NULL) before it reads anything.
        v_cur := NULL;
        FOR r IN SELECT v.i, c.id, c.state, c.due, c.concurrency_key, c.concurrency_limit, c.rate_key, c.rate_limit,
                        c.rate_period_ms
                   FROM unnest(v_visit) WITH ORDINALITY AS v(i, ord)
                  CROSS JOIN LATERAL (
                        SELECT * FROM (
                            SELECT * FROM (
                                SELECT s.id, s.state, COALESCE(s.next_attempt_at, '-infinity'::timestamptz) AS due,
                                       s.concurrency_key, s.concurrency_limit, s.rate_key, s.rate_limit,
                                       s.rate_period_ms
                                  FROM stepready.steps s
                                 WHERE (k[v.i]).pos_id = 0 AND s.id = (k[v.i]).first_id
                                   AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                   AND NOT s.task_held
                                   AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = (k[v.i]).key
                                   AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                                   AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                                   FOR UPDATE SKIP LOCKED) a
                            UNION ALL
                            SELECT * FROM (
                                SELECT s.id, s.state, COALESCE(s.next_attempt_at, '-infinity'::timestamptz) AS due,
                                       s.concurrency_key, s.concurrency_limit, s.rate_key, s.rate_limit,
                                       s.rate_period_ms
                                  FROM stepready.steps s
                                 WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                   AND NOT s.task_held
                                   AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = (k[v.i]).key
                                   AND (COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id)
                                       > ((k[v.i]).pos_due, (k[v.i]).pos_id)
                                   AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                                   AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                                 ORDER BY COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id
                                 LIMIT v_q
                                   FOR UPDATE SKIP LOCKED) b
                            LIMIT v_q) u
                         WHERE p_rq IS NULL
                        UNION ALL
                        SELECT * FROM (
                            SELECT * FROM (
                                SELECT s.id, s.state, GREATEST(s.next_attempt_at, '-infinity'::timestamptz) AS due,
                                       s.concurrency_key, s.concurrency_limit, s.rate_key, s.rate_limit,
                                       s.rate_period_ms
                                  FROM stepready.steps s
                                 WHERE (k[v.i]).pos_id = 0 AND s.id = (k[v.i]).first_id
                                   AND s.queue = ANY (p_rq) AND s.handler = ANY (p_rh)
                                   AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                   AND NOT s.task_held
                                   AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = (k[v.i]).key
                                   AND GREATEST(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                                   AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                                   FOR UPDATE SKIP LOCKED) a
                            UNION ALL
                            SELECT * FROM (
                                SELECT s.id, s.state, m.due, s.concurrency_key, s.concurrency_limit, s.rate_key,
                                       s.rate_limit, s.rate_period_ms
                                  FROM (SELECT y.id, y.due
                                          FROM unnest(p_rq, p_rh) AS rt(q, h)
                                         CROSS JOIN LATERAL (
                                               SELECT s2.id, GREATEST(s2.next_attempt_at, '-infinity'::timestamptz) AS due
                                                 FROM stepready.steps s2
                                                WHERE s2.queue = rt.q AND s2.handler = rt.h
                                                  AND s2.state IN ('pending', 'waiting_for_retry')
                                                  AND s2.pending_parents = 0 AND NOT s2.task_held
                                                  AND s2.task_priority = p_tp AND s2.priority = p_p
                                                  AND s2.flow_key = (k[v.i]).key
                                                  AND (GREATEST(s2.next_attempt_at, '-infinity'::timestamptz), s2.id)
                                                      > ((k[v.i]).pos_due, (k[v.i]).pos_id)
                                                  AND GREATEST(s2.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                                                  AND stepready.retry_eligible(s2.attempts, s2.max_attempts,
                                                                               s2.retryable)
                                                ORDER BY s2.queue, s2.handler, s2.task_priority, s2.priority,
                                                         s2.flow_key,
                                                         GREATEST(s2.next_attempt_at, '-infinity'::timestamptz), s2.id
                                                LIMIT v_q) y) m
                                  JOIN stepready.steps s ON s.id = m.id
                                 WHERE s.queue = ANY (p_rq) AND s.handler = ANY (p_rh)
                                   AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                                   AND NOT s.task_held
                                   AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = (k[v.i]).key
                                   AND GREATEST(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                                   AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                                 ORDER BY m.due, m.id
                                 LIMIT v_q
                                   FOR UPDATE OF s SKIP LOCKED) b
                            LIMIT v_q) u
                         WHERE p_rq IS NOT NULL) c
                  ORDER BY v.ord, c.due, c.id
        LOOP
            EXIT WHEN v_want <= 0;
            IF r.i IS DISTINCT FROM v_cur THEN
                IF v_cur IS NOT NULL THEN
                    k[v_cur] := ks;
                    IF ks.open AND ks.pass_taken = v_q THEN
                        v_prod := v_prod || v_cur;
                    END IF;
                END IF;
                v_cur := r.i;
                ks := k[v_cur];
                ks.pass_taken := 0;
            END IF;
            CONTINUE WHEN NOT ks.open;
            -- The limits that apply to this step: the operator's override, else the step's own, recorded as the
            -- key's last applied limits.
            v_c_lim := NULL;
            v_r_lim := NULL;
            v_per := NULL;
            IF r.concurrency_key IS NOT NULL THEN
                IF ks.concurrency_limit IS DISTINCT FROM r.concurrency_limit THEN
                    ks.concurrency_limit := r.concurrency_limit;
                    ks.dirty := true;
                END IF;
                v_c_lim := COALESCE(ks.override_concurrency_limit, r.concurrency_limit);
            END IF;
            IF r.rate_key = ks.key THEN
                ks.rate_limit := r.rate_limit;
                ks.rate_period_ms := r.rate_period_ms;
                ks.dirty := true; -- its tokens change
                v_r_lim := COALESCE(ks.override_rate_limit, r.rate_limit);
                v_per := COALESCE(ks.override_rate_period_ms, r.rate_period_ms);
            END IF;
            v_why := stepready._flow_refusal(ks.in_flight + ks.taken, v_c_lim, ks.rate_tat, v_r_lim, v_per, p_as_of);
            IF v_why = 'concurrency_limited' THEN
                ks.open := false;
                ks.is_full := true;
                ks.dirty := true;
                CONTINUE;
            ELSIF v_why = 'rate_limited' THEN
                ks.wake_at := stepready._flow_next_token(ks.rate_tat, v_r_lim, v_per, p_as_of);
                ks.open := false;
                CONTINUE;
            END IF;
            IF v_r_lim IS NOT NULL THEN
                ks.rate_tat := (stepready._flow_tokens(ks.rate_tat, v_r_lim, v_per, p_as_of, 1)).p_new_tat;
            ELSIF r.rate_key IS NOT NULL THEN
                -- A rate key other than the step's concurrency key: a token from its own row, if free.
                IF NOT stepready._claim_flow_other_token(r.rate_key, r.rate_limit, r.rate_period_ms, p_as_of) THEN
                    ks.open := false;
                    v_skipped := true;
                    CONTINUE;
                END IF;
            END IF;
            ks.taken := ks.taken + 1;
            ks.pass_taken := ks.pass_taken + 1;
            ks.pos_due := r.due;
            ks.pos_id := r.id;
            p_ids := p_ids || r.id;
            p_states := p_states || r.state;
            v_want := v_want - 1;
            IF v_q = 1 THEN
                v_last := ks.key;
            END IF;
        END LOOP;
        -- The last key of the pass. A key that gave all the pass asked may give more; the others (fewer rows due,
        -- a limit reached, rows locked by another claim) are not visited again by this claim.
        IF v_cur IS NOT NULL THEN
            k[v_cur] := ks;
            IF ks.open AND ks.pass_taken = v_q THEN
                v_prod := v_prod || v_cur;
            END IF;
        END IF;
    END LOOP;

    -- What changed in the keys' state (tokens, wake-up time, the limits applied), written once per key; the
    -- rows are locked by this claim, so they still hold what was read.
    UPDATE stepready.flow_state f
       SET rate_tat = u.rate_tat, wake_at = u.wake_at, is_full = u.is_full, concurrency_limit = u.concurrency_limit,
           rate_limit = u.rate_limit, rate_period_ms = u.rate_period_ms
      FROM (SELECT x.* FROM unnest(k) x WHERE x.dirty AND x.key <> '') u
     WHERE f.key = u.key
       AND (f.rate_tat IS DISTINCT FROM u.rate_tat OR f.wake_at IS DISTINCT FROM u.wake_at
            OR f.is_full <> u.is_full OR f.concurrency_limit IS DISTINCT FROM u.concurrency_limit
            OR f.rate_limit IS DISTINCT FROM u.rate_limit OR f.rate_period_ms IS DISTINCT FROM u.rate_period_ms);

    IF v_skipped AND v_want > 0 THEN
        -- Steps of keys held by another claim were passed over: the daemons' next probe claims them (no NOTIFY
        -- in a claim: it would serialise the claims' commits, sql/045_notify.sql).
        PERFORM stepready._notify_ready(NULL);
    END IF;
    p_cursor := COALESCE(v_last, p_cursor);
END;
$$;

-- The state of the keys of one batch of _claim_flow_group, in key order (ring order): '' (the steps without a
-- key) when it is in p_batch, and the keys of p_got, just locked by _claim_flow_lock: their slots taken
-- (_flow_in_flight_keys, counted in a statement after the locks), flow_state and override, and their first
-- claimable rows as p_batch/p_first give them. A key read as full or waiting for a token is written back
-- whatever happens (dirty).
CREATE OR REPLACE FUNCTION stepready._claim_flow_keys(p_batch text[], p_first bigint[], p_got text[],
                                                      p_as_of timestamptz)
RETURNS stepready._claim_key[]
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_flight jsonb := '{}';  -- key -> slots taken
    v_first  jsonb;          -- key -> its first claimable row
BEGIN
    IF cardinality(p_got) > 0 THEN
        SELECT COALESCE(jsonb_object_agg(c.key, c.in_flight), '{}') INTO v_flight
          FROM stepready._flow_in_flight_keys(p_got, p_as_of) c;
    END IF;
    -- Keys are looked up in jsonb objects (a binary search): a join of two arrays of 1,000 keys each, estimated at
    -- 10 rows, was planned as a 1,000 x 1,000 nested loop.
    SELECT jsonb_object_agg(b.key, b.id) INTO v_first FROM unnest(p_batch, p_first) AS b(key, id);
    RETURN ARRAY(
        SELECT ROW(x.in_flight, 0, 0, (v_first ->> x.key)::bigint, '-infinity'::timestamptz, 0::bigint, true,
                   false, x.dirty, x.rate_tat, NULL::timestamptz, x.c_own, x.r_own, x.p_own, x.c_ovr, x.r_ovr,
                   x.p_ovr, x.key)::stepready._claim_key
          FROM (SELECT '' AS key, 0 AS in_flight, false AS dirty, NULL::timestamptz AS rate_tat, NULL::int AS c_own,
                       NULL::int AS r_own, NULL::bigint AS p_own, NULL::int AS c_ovr, NULL::int AS r_ovr,
                       NULL::bigint AS p_ovr
                 WHERE p_batch[1] = ''
                UNION ALL
                SELECT f.key, COALESCE((v_flight ->> f.key)::int, 0), f.is_full OR f.wake_at IS NOT NULL, f.rate_tat,
                       f.concurrency_limit, f.rate_limit, f.rate_period_ms, l.concurrency_limit, l.rate_limit,
                       l.rate_period_ms
                  FROM stepready.flow_state f
                  LEFT JOIN stepready.flow_limits l ON l.key = f.key
                 WHERE f.key = ANY (p_got)) x
         ORDER BY x.key);
END;
$$;

