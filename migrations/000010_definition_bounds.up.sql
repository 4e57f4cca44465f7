-- stepready schema, version 10: bounds on what a definition hands to River and the Go runtime (issue 25).
--
-- A value accepted here but refused later is refused at every claim: one step whose queue River does not accept
-- made every InsertManyTx fail, a rate period of 1e16 ms overflowed the token bucket of every claim (22008), a
-- timeout beyond a Go time.Duration timed out at once, an 'infinity' due time could not be read by the daemon's
-- wake-up timer. CHECK constraints now hold the bounds of sql/015_bounds.sql for every row, whatever writes it (the
-- insert trigger and the definition checks give the same bounds first, with messages naming the step and field).
--
-- Rows written before this version may break them. They are repaired, not refused: refusing would leave the
-- version dirty until an operator rewrote the rows by hand, and each repair below keeps what the value meant
-- (a delay of "practically forever" stays practically forever, a queue keeps its words). Every repaired step and
-- task gets an `operator.repair` event saying what changed (docs/upgrades.md). Templates are not rewritten: one
-- that breaks a bound is refused, naming the field, when a task is created from it.
BEGIN;

-- Everything below rewrites or re-checks whole tables: take every lock first, in one order, so that no
-- concurrent transaction holding a row this migration updates can wait on the table lock it takes afterwards.
LOCK TABLE stepready.retry_policies, stepready.tasks, stepready.steps, stepready.flow_limits, stepready.flow_state,
    stepready.schedules IN ACCESS EXCLUSIVE MODE;

-- 1. Presets and operator overrides: durations beyond a Go duration become the longest one.
UPDATE stepready.retry_policies
   SET base_delay_ms = LEAST(base_delay_ms, 9223372036854), max_delay_ms = LEAST(max_delay_ms, 9223372036854)
 WHERE base_delay_ms > 9223372036854 OR max_delay_ms > 9223372036854;

-- A key longer than 255 characters keeps its first 238, then "~" and 16 hex digits of its MD5, so that two long
-- keys stay two keys (the steps' keys below get the same rewrite, so they still meet their override).
UPDATE stepready.flow_limits
   SET key = CASE WHEN char_length(key) > 255 THEN left(key, 238) || '~' || left(md5(key), 16) ELSE key END,
       rate_period_ms = LEAST(rate_period_ms, 9223372036854),
       updated_at = now()
 WHERE char_length(key) > 255 OR rate_period_ms > 9223372036854;

-- The claims' own per-key state: a bucket computed under a period out of range is reset to full, and a row with
-- a long key is dropped (the key's next claim creates it again).
DELETE FROM stepready.flow_state WHERE char_length(key) > 255;
UPDATE stepready.flow_state
   SET rate_period_ms = LEAST(rate_period_ms, 9223372036854), rate_tat = NULL, wake_at = NULL
 WHERE rate_period_ms > 9223372036854
    OR rate_tat > now() + 9223372036854 * interval '1 millisecond'
    OR wake_at > now() + 9223372036854 * interval '1 millisecond';

-- A schedule whose next fire time is infinite gets none: the leader computes it again from its cron.
UPDATE stepready.schedules SET next_fire_at = NULL, updated_at = now() WHERE NOT isfinite(next_fire_at);

-- 2. Tasks: an infinite run_at becomes the last microsecond of year 9999 (never, in practice) or no delay; the
-- task's retry defaults get their durations capped. (The run_at trigger moves the unstarted steps with it.)
CREATE TEMPORARY TABLE stepready_repaired_tasks ON COMMIT DROP AS
SELECT t.id, jsonb_strip_nulls(jsonb_build_object(
           'run_at', CASE WHEN NOT isfinite(t.run_at) THEN jsonb_build_object(
                         'from', t.run_at::text,
                         'to', CASE WHEN t.run_at > now() THEN '9999-12-31 23:59:59.999999+00' END) END,
           'retry.base_delay_ms', CASE WHEN (t.retry ->> 'base_delay_ms')::numeric > 9223372036854 THEN
                         jsonb_build_object('from', t.retry -> 'base_delay_ms', 'to', 9223372036854) END,
           'retry.max_delay_ms', CASE WHEN (t.retry ->> 'max_delay_ms')::numeric > 9223372036854 THEN
                         jsonb_build_object('from', t.retry -> 'max_delay_ms', 'to', 9223372036854) END)) AS changes
  FROM stepready.tasks t
 WHERE NOT isfinite(t.run_at)
    OR (jsonb_typeof(t.retry -> 'base_delay_ms') = 'number' AND (t.retry ->> 'base_delay_ms')::numeric > 9223372036854)
    OR (jsonb_typeof(t.retry -> 'max_delay_ms') = 'number' AND (t.retry ->> 'max_delay_ms')::numeric > 9223372036854);

UPDATE stepready.tasks t
   SET run_at = CASE WHEN r.changes ? 'run_at' THEN (r.changes -> 'run_at' ->> 'to')::timestamptz ELSE t.run_at END,
       retry = t.retry
               || CASE WHEN r.changes ? 'retry.base_delay_ms' THEN '{"base_delay_ms": 9223372036854}'::jsonb
                       ELSE '{}' END
               || CASE WHEN r.changes ? 'retry.max_delay_ms' THEN '{"max_delay_ms": 9223372036854}'::jsonb
                       ELSE '{}' END,
       updated_at = now()
  FROM stepready_repaired_tasks r
 WHERE t.id = r.id;

INSERT INTO stepready.step_events (task_id, event, details, at)
SELECT r.id, 'operator.repair', jsonb_build_object('migration', 10, 'changes', r.changes), now()
  FROM stepready_repaired_tasks r
 ORDER BY r.id;

-- 3. Steps. A queue River refuses is rewritten as River spells names: lowercased, every run of other characters
-- turned into one "-", runs of separators folded into their first, separators trimmed from both ends, cut to 64
-- ("Bad Queue!" becomes "bad-queue"; nothing left becomes "default"). A duration beyond a Go duration becomes the
-- longest one; a key longer than 255 characters is shortened as in flow_limits above; an infinite due time
-- becomes the end of year 9999 (infinity) or none (-infinity).
CREATE TEMPORARY TABLE stepready_repaired_steps ON COMMIT DROP AS
SELECT s.id, s.task_id, s.attempts, s.iteration, s.state, jsonb_strip_nulls(jsonb_build_object(
           'queue', CASE WHEN NOT (s.queue = 'default'
                                   OR (octet_length(s.queue) <= 64 AND s.queue ~ '^[a-z0-9]+([_|-]?[a-z0-9]+)*$'))
                    THEN jsonb_build_object('from', s.queue, 'to', COALESCE(NULLIF(
                         rtrim(left(btrim(regexp_replace(regexp_replace(lower(s.queue), '[^a-z0-9_|-]+', '-', 'g'),
                                                         '([_|-])[_|-]+', '\1', 'g'), '_|-'), 64), '_|-'),
                         ''), 'default')) END,
           'handler', CASE WHEN char_length(s.handler) > 255 THEN
                         jsonb_build_object('from', s.handler, 'to', left(s.handler, 238) || '~' || left(md5(s.handler), 16)) END,
           'timeout_ms', CASE WHEN s.timeout_ms > 9223372036854 THEN
                         jsonb_build_object('from', s.timeout_ms, 'to', 9223372036854) END,
           'base_delay_ms', CASE WHEN s.base_delay_ms > 9223372036854 THEN
                         jsonb_build_object('from', s.base_delay_ms, 'to', 9223372036854) END,
           'max_delay_ms', CASE WHEN s.max_delay_ms > 9223372036854 THEN
                         jsonb_build_object('from', s.max_delay_ms, 'to', 9223372036854) END,
           'rate_period_ms', CASE WHEN s.rate_period_ms > 9223372036854 THEN
                         jsonb_build_object('from', s.rate_period_ms, 'to', 9223372036854) END,
           'concurrency_key', CASE WHEN char_length(s.concurrency_key) > 255 THEN
                         jsonb_build_object('from', s.concurrency_key,
                                            'to', left(s.concurrency_key, 238) || '~' || left(md5(s.concurrency_key), 16)) END,
           'rate_key', CASE WHEN char_length(s.rate_key) > 255 THEN
                         jsonb_build_object('from', s.rate_key,
                                            'to', left(s.rate_key, 238) || '~' || left(md5(s.rate_key), 16)) END,
           'next_attempt_at', CASE WHEN NOT isfinite(s.next_attempt_at) THEN jsonb_build_object(
                         'from', s.next_attempt_at::text,
                         'to', CASE WHEN s.next_attempt_at > now() THEN '9999-12-31 23:59:59.999999+00' END) END
       )) AS changes
  FROM stepready.steps s
 WHERE NOT (s.queue = 'default' OR (octet_length(s.queue) <= 64 AND s.queue ~ '^[a-z0-9]+([_|-]?[a-z0-9]+)*$'))
    OR char_length(s.handler) > 255
    OR s.timeout_ms > 9223372036854 OR s.base_delay_ms > 9223372036854 OR s.max_delay_ms > 9223372036854
    OR s.rate_period_ms > 9223372036854
    OR char_length(s.concurrency_key) > 255 OR char_length(s.rate_key) > 255
    OR NOT isfinite(s.next_attempt_at);

UPDATE stepready.steps s
   SET queue           = COALESCE(r.changes -> 'queue' ->> 'to', s.queue),
       handler         = COALESCE(r.changes -> 'handler' ->> 'to', s.handler),
       timeout_ms      = LEAST(s.timeout_ms, 9223372036854),
       base_delay_ms   = LEAST(s.base_delay_ms, 9223372036854),
       max_delay_ms    = LEAST(s.max_delay_ms, 9223372036854),
       rate_period_ms  = LEAST(s.rate_period_ms, 9223372036854),
       concurrency_key = COALESCE(r.changes -> 'concurrency_key' ->> 'to', s.concurrency_key),
       rate_key        = COALESCE(r.changes -> 'rate_key' ->> 'to', s.rate_key),
       next_attempt_at = CASE WHEN r.changes ? 'next_attempt_at'
                              THEN (r.changes -> 'next_attempt_at' ->> 'to')::timestamptz
                              ELSE s.next_attempt_at END,
       updated_at      = now()
  FROM stepready_repaired_steps r
 WHERE s.id = r.id;

INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state, details, at)
SELECT r.task_id, r.id, r.attempts, r.iteration, 'operator.repair', r.state, r.state,
       jsonb_build_object('migration', 10, 'changes', r.changes), now()
  FROM stepready_repaired_steps r
 ORDER BY r.id;

-- 4. The bounds, for every row from now on. One ALTER TABLE per table: each table is read once to check them.
-- The names say the rule; docs/tables.md lists them. (The queue constraint replaces steps_queue_check, queue <> '',
-- which it implies.)
ALTER TABLE stepready.retry_policies
    ADD CONSTRAINT retry_policies_base_delay_ms_fits_a_go_duration CHECK (base_delay_ms <= 9223372036854),
    ADD CONSTRAINT retry_policies_max_delay_ms_fits_a_go_duration CHECK (max_delay_ms <= 9223372036854);

ALTER TABLE stepready.tasks
    ADD CONSTRAINT tasks_run_at_is_finite CHECK (isfinite(run_at));

ALTER TABLE stepready.steps
    DROP CONSTRAINT steps_queue_check,
    ADD CONSTRAINT steps_queue_is_a_river_queue_name
        CHECK (queue = 'default' OR (octet_length(queue) <= 64 AND queue ~ '^[a-z0-9]+([_|-]?[a-z0-9]+)*$')),
    ADD CONSTRAINT steps_handler_at_most_255_characters CHECK (char_length(handler) <= 255),
    ADD CONSTRAINT steps_timeout_ms_fits_a_go_duration CHECK (timeout_ms <= 9223372036854),
    ADD CONSTRAINT steps_base_delay_ms_fits_a_go_duration CHECK (base_delay_ms <= 9223372036854),
    ADD CONSTRAINT steps_max_delay_ms_fits_a_go_duration CHECK (max_delay_ms <= 9223372036854),
    ADD CONSTRAINT steps_rate_period_ms_fits_a_go_duration CHECK (rate_period_ms <= 9223372036854),
    ADD CONSTRAINT steps_concurrency_key_at_most_255_characters CHECK (char_length(concurrency_key) <= 255),
    ADD CONSTRAINT steps_rate_key_at_most_255_characters CHECK (char_length(rate_key) <= 255),
    ADD CONSTRAINT steps_next_attempt_at_is_finite CHECK (isfinite(next_attempt_at));

ALTER TABLE stepready.flow_limits
    ADD CONSTRAINT flow_limits_key_at_most_255_characters CHECK (char_length(key) <= 255),
    ADD CONSTRAINT flow_limits_rate_period_ms_fits_a_go_duration CHECK (rate_period_ms <= 9223372036854);

ALTER TABLE stepready.schedules
    ADD CONSTRAINT schedules_next_fire_at_is_finite CHECK (isfinite(next_fire_at));

COMMIT;
