-- Claiming ready steps (SPEC §6). Safe across any number of concurrent claimers.

-- Picks and locks up to p_limit ready steps, in claim order: task priority desc, step priority desc, then within
-- one (task priority, step priority) group round-robin across fairness keys (SPEC §14: steps without a key form
-- one group), each key's steps by due time (NULL first) and id. Returns their ids in that order, and in p_states
-- the states they had (the rows are locked, so the claim reads no row twice).
--
-- It reads steps_claim_order_idx, which holds only claimable rows (not in flight or terminal, every parent
-- satisfied, task runnable and unpaused) keyed by (task_priority, priority, flow_key, due time, id). Within one
-- group and key the due rows are one range of the index, read in order and only as far as needed; the next
-- group or key is found with one index probe. The cost is that of the rows taken (plus rows locked by other
-- claimers, skipped), one probe per group visited and, where keys are present, one probe per key visited,
-- whatever the size of the table and however many rows wait on a future backoff. A group without keyed rows
-- costs one probe more than before flow control.
--
-- FOR UPDATE SKIP LOCKED locks the real rows as the LIMIT takes them: a row locked by another claimer is skipped,
-- and a row another claimer already moved on fails the re-checked WHERE clause, so concurrent claimers get
-- disjoint sets. The whole readiness rule is checked on the locked row: task_held stands for the task's status and
-- pause (kept in step with the task in the same transaction by triggers), and retry eligibility is tested here.
-- Flow limits are checked by _claim_flow_group under the lock of each key's flow_state row.
DROP FUNCTION IF EXISTS stepready._claim_pick(int, timestamptz); -- before it returned the ids only
CREATE OR REPLACE FUNCTION stepready._claim_pick_rows(p_limit int, p_as_of timestamptz,
                                                      OUT p_ids bigint[], OUT p_states text[])
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
-- Every statement here is a probe or a range of steps_claim_order_idx. When statistics say most claimable rows
-- are keyed, "is there a keyed row in this group?" was planned as a sequential scan that stops at the first
-- match: it read every finished row before it (measured: 9 ms per claim after 20,000 steps had run).
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_tp      int;
    v_p       int;
    v_cursor  text;
    v_start   text;
    v_keyed   bool := false;
    v_locked  bool := false;
BEGIN
    p_ids := '{}';
    p_states := '{}';
    SELECT s.task_priority INTO v_tp
      FROM stepready.steps s
     WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
     ORDER BY s.task_priority DESC
     LIMIT 1;
    WHILE v_tp IS NOT NULL LOOP
        SELECT s.priority INTO v_p
          FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND s.task_priority = v_tp
         ORDER BY s.priority DESC
         LIMIT 1;
        WHILE v_p IS NOT NULL LOOP
            IF NOT EXISTS (SELECT 1 FROM stepready.steps s
                            WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                              AND NOT s.task_held AND s.task_priority = v_tp AND s.priority = v_p
                              AND s.flow_key > '') THEN
                -- No keyed row in this group: its steps in due order.
                SELECT p_ids || array_agg(k.id ORDER BY k.due, k.id), p_states || array_agg(k.state ORDER BY k.due, k.id)
                  INTO p_ids, p_states
                  FROM (SELECT s.id, s.state, COALESCE(s.next_attempt_at, '-infinity'::timestamptz) AS due
                          FROM stepready.steps s
                         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                           AND NOT s.task_held
                           AND s.task_priority = v_tp AND s.priority = v_p AND s.flow_key = ''
                           AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                           AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                         ORDER BY COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id
                         LIMIT p_limit - cardinality(p_ids)
                           FOR UPDATE SKIP LOCKED) AS k;
                p_ids := COALESCE(p_ids, '{}');
                p_states := COALESCE(p_states, '{}');
            ELSE
                IF NOT v_keyed THEN
                    SELECT c.last_key INTO v_cursor FROM stepready.flow_cursor c WHERE c.id = 1;
                    v_start := v_cursor;
                    v_keyed := true;
                END IF;
                SELECT g.p_ids, g.p_states, g.p_cursor, g.p_locked INTO p_ids, p_states, v_cursor, v_locked
                  FROM stepready._claim_flow_group(v_tp, v_p, p_limit, p_as_of, p_ids, p_states, v_cursor,
                                                   v_locked) g;
            END IF;
            IF cardinality(p_ids) >= p_limit THEN
                EXIT;
            END IF;
            SELECT s.priority INTO v_p
              FROM stepready.steps s
             WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
               AND s.task_priority = v_tp AND s.priority < v_p
             ORDER BY s.priority DESC
             LIMIT 1;
        END LOOP;
        EXIT WHEN cardinality(p_ids) >= p_limit;
        SELECT s.task_priority INTO v_tp
          FROM stepready.steps s
         WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
           AND s.task_priority < v_tp
         ORDER BY s.task_priority DESC
         LIMIT 1;
    END LOOP;
    -- The round-robin position moves on for the next claim. A claim that finds the row locked leaves it to the
    -- claim holding it (both started from the same position; one of them moves it).
    IF v_keyed AND v_cursor IS DISTINCT FROM v_start THEN
        PERFORM 1 FROM stepready.flow_cursor c WHERE c.id = 1 FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            UPDATE stepready.flow_cursor SET last_key = v_cursor WHERE id = 1;
        END IF;
    END IF;
END;
$$;

-- One (task priority, step priority) group with keyed rows (SPEC §14). Adds up to p_limit - cardinality(p_ids)
-- rows to p_ids/p_states, round-robin across the group's fairness keys ('' standing for the steps without a
-- key, which has no limit): the first round takes one step per key in ring order, starting after p_cursor (the
-- key the previous claim served last) and wrapping around; later rounds share what is left evenly among the
-- keys that still gave. p_cursor comes back as the last key served in the first round.
--
-- Limits: each key's flow_state row is locked before its limits are read; the first keys of a claim wait for
-- their locks (taken in key order, so claims never deadlock with each other), keys found later are skipped when
-- another claim holds them (the claim then notifies, so the skipped steps are claimed right after). With the lock
-- held, steps in flight are counted from steps_in_flight_key_idx in a statement of their own, which sees every
-- claim committed before ours: a key never has more than its limit in flight, not even for an instant. Rate
-- limits take one token per step (_flow_tokens); a key left with claimable steps and no token records when the
-- next token arrives (wake_at, read by next_flow_at).
CREATE OR REPLACE FUNCTION stepready._claim_flow_group(
    p_tp int, p_p int, p_limit int, p_as_of timestamptz,
    INOUT p_ids bigint[], INOUT p_states text[], INOUT p_cursor text, INOUT p_locked bool)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
-- Every per-key read is an index probe (steps_claim_order_idx, steps_in_flight_key_idx, flow_state's key): never a
-- plan that reads a whole index or table once statistics make the tables look small.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_want     int := p_limit - cardinality(p_ids);
    v_round1   bool := true;
    v_after    text := p_cursor;   -- round 1: keys after this one...
    v_upto     text;               -- ...and up to this one (after wrapping around)
    v_wrapped  bool := p_cursor IS NULL;
    v_batch    text[];
    v_first    bigint[];           -- the first claimable row of each key of v_batch, as its probe found it
    v_firstmap jsonb;              -- key -> that row's id, for the keys just locked
    v_got      text[];
    v_visit    int[];              -- the keys of one pass, as positions in the k_ arrays
    v_flight   jsonb;              -- key -> steps in flight, for the keys just locked
    v_keyset   jsonb;              -- the keys just locked, as an object's keys
    v_prod     int[] := '{}';      -- keys that gave all a pass asked and may give more
    v_i        int;
    v_n        int;
    v_q        int;
    v_skipped  bool := false;
    v_last     text;
    -- Per key met in this group, parallel arrays indexed by the key's position in k_key.
    k_key      text[] := '{}';
    k_flight   int[] := '{}';          -- in flight when the key was locked
    k_taken    int[] := '{}';          -- taken by this claim
    k_pass     int[] := '{}';          -- taken in the current pass
    k_c_ovr    int[] := '{}';          -- flow_limits overrides
    k_r_ovr    int[] := '{}';
    k_p_ovr    bigint[] := '{}';
    k_tat      timestamptz[] := '{}';  -- rate_tat
    k_wake     timestamptz[] := '{}';
    k_c_own    int[] := '{}';          -- the steps' own limits, as applied
    k_r_own    int[] := '{}';
    k_p_own    bigint[] := '{}';
    k_pos_due  timestamptz[] := '{}';  -- where the key's range was left
    k_pos_id   bigint[] := '{}';
    k_first    bigint[] := '{}';       -- the key's first row as probed, tried by id on the key's first visit
    k_open     bool[] := '{}';         -- may give more
    k_full     bool[] := '{}';         -- stopped by its concurrency limit (as read, then as found)
    k_dirty    bool[] := '{}';         -- something to write back
    r          record;
    v_allowed  int;
    v_tat      timestamptz;
    v_lim      int;
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
              FROM stepready._flow_next_rows(p_tp, p_p, v_after, v_upto, GREATEST(v_want, 16)) n;
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
            -- Lock the keys' flow_state rows, then read their state in a statement of its own: the in-flight
            -- counts, read after the locks, see every claim committed before ours.
            v_got := stepready._claim_flow_lock(v_batch, p_locked);
            p_locked := p_locked OR cardinality(v_got) > 0;
            v_skipped := v_skipped OR cardinality(v_got) < cardinality(array_remove(v_batch, ''));
            -- Steps holding slots of the keys locked (in flight, or orphaned leases: _holds_slot), counted once
            -- for all of them by _flow_in_flight_keys (at most one pass over the steps holding slots).
            v_flight := '{}';
            IF cardinality(v_got) > 0 THEN
                SELECT jsonb_object_agg(k.key, true) INTO v_keyset FROM unnest(v_got) AS k(key);
                SELECT stepready._flow_in_flight_keys(v_keyset, p_as_of) INTO v_flight;
            END IF;
            SELECT jsonb_object_agg(b.key, b.id) INTO v_firstmap FROM unnest(v_batch, v_first) AS b(key, id);
            -- A batch is in key order ('' first when it is in it): key order is ring order.
            -- The keys' state as arrays, appended in one step each (a loop appending per key costs more).
            SELECT cardinality(k_key) INTO v_i;
            SELECT k_key || array_agg(x.key ORDER BY x.key),
                   k_flight || array_agg(x.flight ORDER BY x.key),
                   k_c_ovr || array_agg(x.c_ovr ORDER BY x.key),
                   k_r_ovr || array_agg(x.r_ovr ORDER BY x.key),
                   k_p_ovr || array_agg(x.p_ovr ORDER BY x.key),
                   k_tat || array_agg(x.rate_tat ORDER BY x.key),
                   k_c_own || array_agg(x.c_own ORDER BY x.key),
                   k_r_own || array_agg(x.r_own ORDER BY x.key),
                   k_p_own || array_agg(x.p_own ORDER BY x.key),
                   -- A key read as full or waiting for a token is written back whatever happens.
                   k_dirty || array_agg(x.is_full OR x.wake_at IS NOT NULL ORDER BY x.key),
                   k_first || array_agg((v_firstmap ->> x.key)::bigint ORDER BY x.key),
                   count(*)::int
              INTO k_key, k_flight, k_c_ovr, k_r_ovr, k_p_ovr, k_tat, k_c_own, k_r_own, k_p_own, k_dirty, k_first,
                   v_n
              FROM (SELECT '' AS key, NULL::timestamptz AS rate_tat, NULL::timestamptz AS wake_at,
                           false AS is_full, NULL::int AS c_own, NULL::int AS r_own, NULL::bigint AS p_own,
                           NULL::int AS c_ovr, NULL::int AS r_ovr, NULL::bigint AS p_ovr, 0 AS flight
                     WHERE v_batch[1] = ''
                    UNION ALL
                    SELECT f.key, f.rate_tat, f.wake_at, f.is_full, f.concurrency_limit, f.rate_limit,
                           f.rate_period_ms, l.concurrency_limit, l.rate_limit, l.rate_period_ms,
                           COALESCE((v_flight ->> f.key)::int, 0)
                      FROM stepready.flow_state f
                      LEFT JOIN stepready.flow_limits l ON l.key = f.key
                     WHERE f.key = ANY (v_got)) x;
            k_key := COALESCE(k_key, '{}');
            IF v_n > 0 THEN
                -- The per-key counters of the new keys, and the pass's visit: the new positions, in ring order.
                k_taken := k_taken || array_fill(0, ARRAY[v_n]);
                k_pass := k_pass || array_fill(0, ARRAY[v_n]);
                k_wake := k_wake || array_fill(NULL::timestamptz, ARRAY[v_n]);
                k_pos_due := k_pos_due || array_fill('-infinity'::timestamptz, ARRAY[v_n]);
                k_pos_id := k_pos_id || array_fill(0::bigint, ARRAY[v_n]);
                k_open := k_open || array_fill(true, ARRAY[v_n]);
                k_full := k_full || array_fill(false, ARRAY[v_n]);
                v_visit := ARRAY(SELECT generate_series(v_i + 1, v_i + v_n));
            ELSE
                v_visit := '{}';
            END IF;
        ELSE
            -- Later rounds: what is left, shared among the keys that gave and may give more.
            EXIT WHEN cardinality(v_prod) = 0;
            v_q := ceil(v_want::numeric / cardinality(v_prod))::int;
            v_visit := v_prod;
            v_prod := '{}';
        END IF;
        FOREACH v_i IN ARRAY v_visit LOOP
            k_pass[v_i] := 0;
        END LOOP;

        -- The next v_q due rows of every key of the pass, after where the key was left, in ring order. While nothing
        -- has been taken from a key (its first visit, in round 1: one row wanted) the row its probe found is tried
        -- first by its primary key: when it is due, eligible and not locked it is exactly the row the range would give (the key's
        -- first in claim order), and the range is not read at all (the LIMIT stops the UNION ALL after it).
        FOR r IN SELECT v.i, c.id, c.state, c.due, c.concurrency_key, c.concurrency_limit, c.rate_key, c.rate_limit,
                        c.rate_period_ms
                   FROM unnest(v_visit) WITH ORDINALITY AS v(i, ord)
                  CROSS JOIN LATERAL (
                        SELECT * FROM (
                            SELECT s.id, s.state, COALESCE(s.next_attempt_at, '-infinity'::timestamptz) AS due,
                                   s.concurrency_key, s.concurrency_limit, s.rate_key, s.rate_limit, s.rate_period_ms
                              FROM stepready.steps s
                             WHERE k_pos_id[v.i] = 0 AND s.id = k_first[v.i]
                               AND s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                               AND NOT s.task_held
                               AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = k_key[v.i]
                               AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                               AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                               FOR UPDATE SKIP LOCKED) a
                        UNION ALL
                        SELECT * FROM (
                            SELECT s.id, s.state, COALESCE(s.next_attempt_at, '-infinity'::timestamptz) AS due,
                                   s.concurrency_key, s.concurrency_limit, s.rate_key, s.rate_limit, s.rate_period_ms
                              FROM stepready.steps s
                             WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0
                               AND NOT s.task_held
                               AND s.task_priority = p_tp AND s.priority = p_p AND s.flow_key = k_key[v.i]
                               AND (COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id)
                                   > (k_pos_due[v.i], k_pos_id[v.i])
                               AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= p_as_of
                               AND stepready.retry_eligible(s.attempts, s.max_attempts, s.retryable)
                             ORDER BY COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id
                             LIMIT v_q
                               FOR UPDATE SKIP LOCKED) b
                        LIMIT v_q) c
                  ORDER BY v.ord, c.due, c.id
        LOOP
            EXIT WHEN v_want <= 0;
            v_i := r.i;
            CONTINUE WHEN NOT k_open[v_i];
            IF r.concurrency_key IS NOT NULL THEN
                IF k_c_own[v_i] IS DISTINCT FROM r.concurrency_limit THEN
                    k_c_own[v_i] := r.concurrency_limit;
                    k_dirty[v_i] := true;
                END IF;
                IF k_flight[v_i] + k_taken[v_i] >= COALESCE(k_c_ovr[v_i], r.concurrency_limit) THEN
                    k_open[v_i] := false;
                    k_full[v_i] := true;
                    k_dirty[v_i] := true;
                    CONTINUE;
                END IF;
            END IF;
            IF r.rate_key = k_key[v_i] THEN
                k_r_own[v_i] := r.rate_limit;
                k_p_own[v_i] := r.rate_period_ms;
                k_dirty[v_i] := true; -- its tokens change
                v_lim := COALESCE(k_r_ovr[v_i], r.rate_limit);
                v_per := COALESCE(k_p_ovr[v_i], r.rate_period_ms);
                SELECT t.p_allowed, t.p_new_tat INTO v_allowed, v_tat
                  FROM stepready._flow_tokens(k_tat[v_i], v_lim, v_per, p_as_of, 1) t;
                IF v_allowed = 0 THEN
                    k_wake[v_i] := stepready._flow_next_token(k_tat[v_i], v_lim, v_per, p_as_of);
                    k_open[v_i] := false;
                    CONTINUE;
                END IF;
                k_tat[v_i] := v_tat;
            ELSIF r.rate_key IS NOT NULL THEN
                -- A rate key other than the step's concurrency key: a token from its own row, if free.
                IF NOT stepready._claim_flow_other_token(r.rate_key, r.rate_limit, r.rate_period_ms, p_as_of) THEN
                    k_open[v_i] := false;
                    v_skipped := true;
                    CONTINUE;
                END IF;
            END IF;
            k_taken[v_i] := k_taken[v_i] + 1;
            k_pass[v_i] := k_pass[v_i] + 1;
            k_pos_due[v_i] := r.due;
            k_pos_id[v_i] := r.id;
            p_ids := p_ids || r.id;
            p_states := p_states || r.state;
            v_want := v_want - 1;
            IF v_q = 1 THEN
                v_last := k_key[v_i];
            END IF;
        END LOOP;
        -- A key that gave less than asked has nothing more due now (or hit a limit).
        FOREACH v_i IN ARRAY v_visit LOOP
            IF k_open[v_i] AND k_pass[v_i] = v_q THEN
                v_prod := v_prod || v_i;
            ELSIF k_pass[v_i] < v_q AND v_want > 0 THEN
                k_open[v_i] := false;
            END IF;
        END LOOP;
    END LOOP;

    -- What changed in the keys' state (tokens, wake-up time, the limits applied), written once per key; the
    -- rows are locked by this claim, so they still hold what was read.
    UPDATE stepready.flow_state f
       SET rate_tat = u.tat, wake_at = u.wake, is_full = u.is_full, concurrency_limit = u.c_own,
           rate_limit = u.r_own, rate_period_ms = u.p_own
      FROM (SELECT x.* FROM unnest(k_key, k_tat, k_wake, k_full, k_c_own, k_r_own, k_p_own, k_dirty)
                AS x(key, tat, wake, is_full, c_own, r_own, p_own, dirty)
             WHERE x.dirty AND x.key <> '') u
     WHERE f.key = u.key
       AND (f.rate_tat IS DISTINCT FROM u.tat OR f.wake_at IS DISTINCT FROM u.wake OR f.is_full <> u.is_full
            OR f.concurrency_limit IS DISTINCT FROM u.c_own OR f.rate_limit IS DISTINCT FROM u.r_own
            OR f.rate_period_ms IS DISTINCT FROM u.p_own);

    IF v_skipped AND v_want > 0 THEN
        -- Steps of keys held by another claim were passed over: wake the daemons once this claim commits.
        PERFORM pg_notify('stepready_ready', '0');
    END IF;
    p_cursor := COALESCE(v_last, p_cursor);
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
-- token now (then its wake-up time is recorded).
CREATE OR REPLACE FUNCTION stepready._claim_flow_other_token(p_key text, p_limit int, p_period_ms bigint,
                                                             p_as_of timestamptz)
RETURNS bool
LANGUAGE plpgsql
AS $$
DECLARE
    f         stepready.flow_state;
    v_lim     int;
    v_per     bigint;
    v_allowed int;
    v_tat     timestamptz;
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
    SELECT t.p_allowed, t.p_new_tat INTO v_allowed, v_tat FROM stepready._flow_tokens(f.rate_tat, v_lim, v_per, p_as_of, 1) t;
    IF v_allowed = 0 THEN
        UPDATE stepready.flow_state SET wake_at = stepready._flow_next_token(f.rate_tat, v_lim, v_per, p_as_of)
         WHERE key = p_key;
        RETURN false;
    END IF;
    UPDATE stepready.flow_state SET rate_tat = v_tat, wake_at = NULL, rate_limit = p_limit, rate_period_ms = p_period_ms
     WHERE key = p_key;
    RETURN true;
END;
$$;

-- Validates the arguments shared by the claiming functions.
CREATE OR REPLACE FUNCTION stepready._check_claim_args(p_limit int, p_worker text, p_lease_ms bigint,
                                                       p_as_of timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'p_limit must be >= 0, got %', COALESCE(p_limit::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    PERFORM stepready._check_lease_args(p_worker, p_lease_ms);
    IF p_as_of IS NULL THEN
        RAISE EXCEPTION 'p_as_of must not be NULL' USING ERRCODE = '22023';
    END IF;
END;
$$;

-- Claims up to p_limit ready steps for p_worker: they move to enqueued with a lease of p_lease_ms, each with a
-- step.enqueued event; a pending task of a claimed step becomes in_progress (trigger steps_after_update).
-- Returns the claimed rows in claim order.
CREATE OR REPLACE FUNCTION stepready.claim_ready_steps(
    p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    step_id    bigint,
    task_id    bigint,
    name       text,
    handler    text,
    input      jsonb,
    attempts   int,
    timeout_ms bigint,
    queue      text)
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ids     bigint[];
    v_states  text[];
    v_lease   timestamptz := p_as_of + p_lease_ms * interval '1 millisecond';
    v_details jsonb;
BEGIN
    PERFORM stepready._check_claim_args(p_limit, p_worker, p_lease_ms, p_as_of);
    IF p_limit = 0 THEN
        RETURN;
    END IF;
    SELECT k.p_ids, k.p_states INTO v_ids, v_states FROM stepready._claim_pick_rows(p_limit, p_as_of) k;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    v_details := jsonb_build_object('worker', p_worker, 'lease_expires_at', v_lease);

    RETURN QUERY
    WITH claimed AS (
        UPDATE stepready.steps s
           SET state = 'enqueued',
               updated_at = now(),
               lease_owner = p_worker,
               lease_expires_at = v_lease
          FROM unnest(v_ids, v_states) WITH ORDINALITY AS p(id, from_state, ord)
         WHERE s.id = p.id
        RETURNING s.*, p.from_state, p.ord
    ), logged AS (
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT c.task_id, c.id, c.attempts, c.iteration, 'step.enqueued', c.from_state, 'enqueued', v_details,
               p_as_of
          FROM claimed c
         ORDER BY c.ord
    )
    SELECT c.id, c.task_id, c.name, c.handler, c.input, c.attempts, c.timeout_ms, c.queue
      FROM claimed c
     ORDER BY c.ord;
END;
$$;

-- Claims and starts in one statement, for a dispatcher that runs what it claims at once (direct dispatch): each
-- step goes from its ready state through enqueued to in_progress with both events (step.enqueued, then
-- attempt.started), exactly as claim_ready_steps followed by start_step would leave it, but with one row update.
-- Returns the started attempts in claim order with what their handlers need: `attempt` is the fencing token
-- (every later call of the attempt carries it), `attempt_number` the attempt's number within its iteration
-- (what users, rules and events see; equal to the token until the step is reset or repeats).
DROP FUNCTION IF EXISTS stepready.claim_and_start_steps(int, text, bigint, timestamptz); -- before attempt_number
CREATE OR REPLACE FUNCTION stepready.claim_and_start_steps(
    p_limit int, p_worker text, p_lease_ms bigint, p_as_of timestamptz DEFAULT now())
RETURNS TABLE (
    step_id    bigint,
    task_id    bigint,
    name       text,
    handler    text,
    input      jsonb,
    attempt    int,
    timeout_ms bigint,
    queue      text,
    iteration  int,
    context    jsonb,
    rules      jsonb,
    attempt_number int)
LANGUAGE plpgsql
-- Generic plans only: the statements are written for them (see start_steps), and a custom plan per call
-- would re-plan every statement on every call (arrays make every custom plan look cheaper).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ids     bigint[];
    v_states  text[];
    v_lease   timestamptz := p_as_of + p_lease_ms * interval '1 millisecond';
    v_details jsonb;
BEGIN
    PERFORM stepready._check_claim_args(p_limit, p_worker, p_lease_ms, p_as_of);
    IF p_limit = 0 THEN
        RETURN;
    END IF;
    SELECT k.p_ids, k.p_states INTO v_ids, v_states FROM stepready._claim_pick_rows(p_limit, p_as_of) k;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    v_details := jsonb_build_object('worker', p_worker, 'lease_expires_at', v_lease);

    RETURN QUERY
    WITH started AS (
        UPDATE stepready.steps s
           SET state = 'in_progress',
               attempts = s.attempts + 1,
               fence_token = s.fence_token + 1,
               last_attempted_at = p_as_of,
               updated_at = now(),
               lease_owner = p_worker,
               lease_expires_at = v_lease
          FROM unnest(v_ids, v_states) WITH ORDINALITY AS p(id, from_state, ord)
         WHERE s.id = p.id
        RETURNING s.*, p.from_state, p.ord
    ), logged AS (
        INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state,
                                           details, at)
        SELECT c.task_id, c.id, e.attempt, c.iteration, e.event, e.from_state, e.to_state, v_details, p_as_of
          FROM started c
         CROSS JOIN LATERAL (VALUES (1, 'step.enqueued', c.from_state, 'enqueued', c.attempts - 1),
                                    (2, 'attempt.started', 'enqueued', 'in_progress', c.attempts))
               AS e(n, event, from_state, to_state, attempt)
         ORDER BY c.ord, e.n
    )
    SELECT c.id, c.task_id, c.name, c.handler, c.input, c.fence_token, c.timeout_ms, c.queue, c.iteration,
           t.context, c.rules, c.attempts
      FROM started c
      JOIN stepready.tasks t ON t.id = c.task_id
     ORDER BY c.ord;
END;
$$;

-- When the next claimable step becomes due after p_as_of, or a rate-limited key gets its next token (NULL: none
-- is waiting on a backoff or a token). Daemons set their
-- wake-up timer from it. Reads the claim index only; parents, pause and task status are already folded into it.
-- PL/pgSQL, not SQL: a SQL function whose body has a FROM clause is not inlined, and PostgreSQL 15 plans it
-- again on every call (0.3 to 0.8 ms, measured); the daemon calls it before every claim.
CREATE OR REPLACE FUNCTION stepready.next_claim_at(p_as_of timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN LEAST((SELECT min(COALESCE(s.next_attempt_at, '-infinity'::timestamptz))
                    FROM stepready.steps s
                   WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
                     AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) > p_as_of),
                 stepready.next_flow_at(p_as_of)); -- a rate key's next token (SPEC §14)
END;
$$;
