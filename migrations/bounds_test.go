package migrations_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/migrations"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// stepsDownBelow returns how many versions Down must step to leave the schema below version v.
func stepsDownBelow(t *testing.T, v int) int {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.up.sql")
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		version, err := strconv.Atoi(strings.SplitN(f, "_", 2)[0])
		require.NoError(t, err)
		if version >= v {
			n++
		}
	}
	return n
}

// Version 10 (issue 25) repairs the rows written before it that break the bounds its CHECK constraints then
// hold, keeping what each value meant, and records every repair of a step or task as an operator.repair event.
func TestVersion10RepairsRowsBeyondTheBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}

	// Rows as an older release let them be written (the checks of the newer insert trigger are not the point
	// here: the rows are made by updates, which an older release did not refuse either).
	require.NoError(t, migrations.Down(ctx, db.URL, nil, stepsDownBelow(t, 10)))
	var taskID, infTask int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "old", "steps": [
		{"name": "q", "handler": "noop"}, {"name": "t", "handler": "noop"},
		{"name": "k", "handler": "noop", "concurrency": {"key": "x", "limit": 1}},
		{"name": "ok", "handler": "noop", "queue": "fine"}]}')`).Scan(&taskID))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "inf", "steps": [
		{"name": "x", "handler": "noop"}]}')`).Scan(&infTask))
	long := strings.Repeat("x", 300)
	exec(`UPDATE stepready.steps SET queue = 'Bad Queue!' WHERE task_id = $1 AND name = 'q'`, taskID)
	exec(`UPDATE stepready.steps SET timeout_ms = 1e16, max_delay_ms = 1e16, rate_key = 'r', rate_limit = 1,
		rate_period_ms = 1e16 WHERE task_id = $1 AND name = 't'`, taskID)
	exec(`UPDATE stepready.steps SET concurrency_key = $2 WHERE task_id = $1 AND name = 'k'`, taskID, long)
	exec(`UPDATE stepready.tasks SET run_at = 'infinity' WHERE id = $1`, infTask)
	// This build's trigger refuses the retry object; an older one took it.
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica;
			UPDATE stepready.tasks SET retry = '{"base_delay_ms": 1e17}' WHERE id = `+strconv.FormatInt(infTask, 10))
		return err
	}))
	exec(`INSERT INTO stepready.flow_limits (key, rate_limit, rate_period_ms) VALUES ('r', 1, 1e16), ($1, 2, 1000)`,
		long)
	exec(`INSERT INTO stepready.flow_state (key, rate_tat, rate_limit, rate_period_ms)
		VALUES ('r', '200000-01-01', 1, 1e16)`)
	exec(`INSERT INTO stepready.retry_policies (name, base_delay_ms, max_delay_ms) VALUES ('huge', 1e18, 1e18)`)
	exec(`INSERT INTO stepready.schedules (name, template, cron, next_fire_at) VALUES ('s', 'tpl', '@hourly', 'infinity')`)

	require.NoError(t, migrations.Up(ctx, db.URL, nil))

	type stepRow struct {
		Queue, Key                *string
		Timeout, MaxDelay, Period *int64
		NextAttemptAt             *string
		RepairEvents              int
		Changes                   json.RawMessage
	}
	step := func(task int64, name string) stepRow {
		t.Helper()
		var r stepRow
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT s.queue, s.concurrency_key, s.timeout_ms, s.max_delay_ms,
			s.rate_period_ms, s.next_attempt_at::text,
			(SELECT count(*) FROM stepready.step_events e WHERE e.task_id = s.task_id AND e.step_id = s.id
			    AND e.event = 'operator.repair'),
			(SELECT e.details -> 'changes' FROM stepready.step_events e WHERE e.task_id = s.task_id
			    AND e.step_id = s.id AND e.event = 'operator.repair')
			FROM stepready.steps s WHERE s.task_id = $1 AND s.name = $2`, task, name).
			Scan(&r.Queue, &r.Key, &r.Timeout, &r.MaxDelay, &r.Period, &r.NextAttemptAt, &r.RepairEvents, &r.Changes))
		return r
	}
	const maxMS = int64(9223372036854)

	q := step(taskID, "q")
	require.Equal(t, "bad-queue", *q.Queue)
	require.Equal(t, 1, q.RepairEvents)
	require.JSONEq(t, `{"queue": {"from": "Bad Queue!", "to": "bad-queue"}}`, string(q.Changes))

	d := step(taskID, "t")
	require.Equal(t, maxMS, *d.Timeout)
	require.Equal(t, maxMS, *d.MaxDelay)
	require.Equal(t, maxMS, *d.Period)
	require.Equal(t, 1, d.RepairEvents)

	k := step(taskID, "k")
	require.Len(t, *k.Key, 255)
	require.True(t, strings.HasPrefix(*k.Key, strings.Repeat("x", 238)+"~"), *k.Key)

	ok := step(taskID, "ok")
	require.Equal(t, "fine", *ok.Queue)
	require.Zero(t, ok.RepairEvents, "a step within the bounds is left alone")

	// The task: run_at 'infinity' is never in practice, and its steps follow; its retry default is capped.
	var runAt, retry string
	var taskRepairs int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT run_at::text, retry::text, (SELECT count(*)
		FROM stepready.step_events WHERE task_id = $1 AND step_id IS NULL AND event = 'operator.repair')
		FROM stepready.tasks WHERE id = $1`, infTask).Scan(&runAt, &retry, &taskRepairs))
	require.Equal(t, "9999-12-31 23:59:59.999999+00", runAt)
	require.JSONEq(t, `{"base_delay_ms": 9223372036854}`, retry)
	require.Equal(t, 1, taskRepairs)
	require.Equal(t, "9999-12-31 23:59:59.999999+00", *step(infTask, "x").NextAttemptAt)

	// Overrides, the claims' per-key state, presets, schedules.
	var period int64
	var longOverrides, longState int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT rate_period_ms FROM stepready.flow_limits WHERE key = 'r'),
		(SELECT count(*) FROM stepready.flow_limits WHERE key = $1), (SELECT count(*) FROM stepready.flow_state
		WHERE char_length(key) > 255)`, long).Scan(&period, &longOverrides, &longState))
	require.Equal(t, maxMS, period)
	require.Zero(t, longOverrides)
	require.Equal(t, *k.Key, func() string {
		var key string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT key FROM stepready.flow_limits WHERE concurrency_limit IS NULL
			AND rate_limit = 2`).Scan(&key))
		return key
	}(), "an override's long key is shortened like its steps' keys, so they still meet")
	var tat *string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT rate_tat::text FROM stepready.flow_state WHERE key = 'r'`).Scan(&tat))
	require.Nil(t, tat, "a bucket computed under a period out of range is full again")
	var presetDelay int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT base_delay_ms FROM stepready.retry_policies WHERE name = 'huge'`).
		Scan(&presetDelay))
	require.Equal(t, maxMS, presetDelay)
	var fire *string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT next_fire_at::text FROM stepready.schedules WHERE name = 's'`).
		Scan(&fire))
	require.Nil(t, fire)

	// The constraints hold from now on.
	_, err := db.Pool.Exec(ctx, `UPDATE stepready.steps SET queue = 'Bad Queue!' WHERE task_id = $1`, taskID)
	require.ErrorContains(t, err, "steps_queue_is_a_river_queue_name")

	// And down again restores the older constraint without failing on the repaired rows.
	require.NoError(t, migrations.Down(ctx, db.URL, nil, stepsDownBelow(t, 10)))
	_, err = db.Pool.Exec(ctx, `UPDATE stepready.steps SET queue = '' WHERE task_id = $1`, taskID)
	require.ErrorContains(t, err, "steps_queue_check")
}
