-- Down from version 10: the bounds' CHECK constraints go; steps.queue is back to "not empty". Rows repaired by
-- the up migration keep their repaired values (and their operator.repair events).
BEGIN;

ALTER TABLE stepready.schedules
    DROP CONSTRAINT schedules_next_fire_at_is_finite;

ALTER TABLE stepready.flow_limits
    DROP CONSTRAINT flow_limits_key_at_most_255_characters,
    DROP CONSTRAINT flow_limits_rate_period_ms_fits_a_go_duration;

ALTER TABLE stepready.steps
    DROP CONSTRAINT steps_queue_is_a_river_queue_name,
    DROP CONSTRAINT steps_handler_at_most_255_characters,
    DROP CONSTRAINT steps_timeout_ms_fits_a_go_duration,
    DROP CONSTRAINT steps_base_delay_ms_fits_a_go_duration,
    DROP CONSTRAINT steps_max_delay_ms_fits_a_go_duration,
    DROP CONSTRAINT steps_rate_period_ms_fits_a_go_duration,
    DROP CONSTRAINT steps_concurrency_key_at_most_255_characters,
    DROP CONSTRAINT steps_rate_key_at_most_255_characters,
    DROP CONSTRAINT steps_next_attempt_at_is_finite,
    ADD CONSTRAINT steps_queue_check CHECK (queue <> '');

ALTER TABLE stepready.tasks
    DROP CONSTRAINT tasks_run_at_is_finite;

ALTER TABLE stepready.retry_policies
    DROP CONSTRAINT retry_policies_base_delay_ms_fits_a_go_duration,
    DROP CONSTRAINT retry_policies_max_delay_ms_fits_a_go_duration;

COMMIT;
