package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// run_at (SPEC §15): no step of the task is claimable before it; step_readiness says `scheduled`, right after
// task_paused; at run_at the steps are claimable. The rule rides on next_attempt_at, so next_claim_at wakes the
// daemon at run_at.
func TestRunAtBoundary(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	runAt := testBase.Add(time.Hour)
	taskID, ids := b.task(fmt.Sprintf(`{"name": "later", "run_at": %q,
		"steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h", "depends_on": ["a"]}]}`,
		runAt.Format(time.RFC3339)))

	var stored time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT run_at FROM stepready.tasks WHERE id = $1`, taskID).Scan(&stored))
	require.True(t, runAt.Equal(stored))

	for _, tc := range []struct {
		name   string
		asOf   time.Time
		reason string
	}{
		{"an hour before", testBase, "scheduled"},
		{"1 ms before", runAt.Add(-time.Millisecond), "scheduled"},
		{"1 µs before", runAt.Add(-tick), "scheduled"},
		{"at run_at", runAt, ""},
	} {
		if tc.reason == "" {
			b.requireReady(ids["a"], tc.asOf)
		} else {
			b.requireNotReady(ids["a"], tc.asOf, tc.reason)
		}
		// The child is scheduled too: `scheduled` comes before waiting_for_dependencies.
		if tc.reason != "" {
			b.requireNotReady(ids["b"], tc.asOf, "scheduled")
		}
	}
	var next *time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.next_claim_at($1)`, testBase).Scan(&next))
	require.NotNil(t, next)
	require.True(t, runAt.Equal(*next), "the daemon wakes at run_at")

	require.Empty(t, b.claim(10, runAt.Add(-time.Millisecond)), "not started 1 ms before run_at")
	got := b.claim(10, runAt)
	require.Len(t, got, 1)
	require.Equal(t, ids["a"], got[0].StepID, "started at run_at")

	// Paused wins over scheduled (§5's order: task_paused, then scheduled).
	other, oids := b.task(fmt.Sprintf(`{"name": "p", "run_at": %q, "steps": [{"name": "x", "handler": "h"}]}`,
		runAt.Format(time.RFC3339)))
	b.exec(`SELECT stepready.pause_task($1)`, other)
	b.requireNotReady(oids["x"], testBase, "task_paused")
}

// explain names the start time and the wait; a backoff equal to run_at is not reported twice.
func TestRunAtExplain(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	runAt := testBase.Add(59 * time.Minute)
	_, ids := b.task(fmt.Sprintf(`{"name": "later", "run_at": %q, "steps": [{"name": "a", "handler": "h"}]}`,
		runAt.Format(time.RFC3339)))
	rows, err := b.db.Pool.Query(b.ctx, `SELECT reason, message FROM stepready.explain_step($1, $2)`, ids["a"], testBase)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var reason, message string
		require.NoError(t, rows.Scan(&reason, &message))
		got = append(got, reason+": "+message)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"scheduled: scheduled: starts at 00:59:00 (in 59m00s)"}, got)
}

// Plain SQL: an INSERT of a task with run_at, then its steps, delays them the same way; changing run_at moves
// the steps that have not started.
func TestRunAtPlainSQL(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	runAt := testBase.Add(10 * time.Minute)
	var taskID, stepID int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `INSERT INTO stepready.tasks (name, run_at) VALUES ('plain', $1)
		RETURNING id`, runAt).Scan(&taskID))
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, handler)
		VALUES ($1, 's', 'h') RETURNING id`, taskID).Scan(&stepID))
	b.requireNotReady(stepID, runAt.Add(-tick), "scheduled")
	b.requireReady(stepID, runAt)

	later := testBase.Add(20 * time.Minute)
	b.exec(`UPDATE stepready.tasks SET run_at = $2 WHERE id = $1`, taskID, later)
	b.requireNotReady(stepID, runAt, "scheduled")
	require.Empty(t, b.claim(10, later.Add(-tick)))
	b.exec(`UPDATE stepready.tasks SET run_at = NULL WHERE id = $1`, taskID)
	b.requireReady(stepID, testBase)
}

// Bad run_at values are definition errors naming the field.
func TestRunAtValidation(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	for _, tc := range []struct{ value, want string }{
		{`"tomorrow"`, `run_at: must be an RFC 3339 timestamp`},
		{`"2030-01-01T00:00:00"`, `run_at: must be an RFC 3339 timestamp`},
		{`"2030-13-01T00:00:00Z"`, `run_at: is not a valid time`},
		{`12`, `run_at: must be an RFC 3339 timestamp string, got number`},
	} {
		_, err := b.db.Pool.Exec(b.ctx, `SELECT stepready.create_task($1::jsonb)`,
			`{"name": "x", "run_at": `+tc.value+`, "steps": [{"name": "a", "handler": "h"}]}`)
		require.ErrorContains(t, err, tc.want, tc.value)
	}
	_, err := b.db.Pool.Exec(b.ctx, `SELECT stepready.create_task($1::jsonb)`,
		`{"name": "x", "run_at": "2030-01-01T01:00:00.250+01:00", "steps": [{"name": "a", "handler": "h"}]}`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `SELECT stepready.create_task($1::jsonb)`,
		`{"name": "x", "run_at": null, "steps": [{"name": "a", "handler": "h"}]}`)
	require.NoError(t, err)
}

// task_execution_context: a task waiting for its run_at is scheduled (issue 26: it read waiting_for_retry, as if
// it had failed), and says when.
func TestRunAtExecutionContext(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	runAt := testBase.Add(time.Hour)
	taskID, _ := b.task(fmt.Sprintf(`{"name": "later", "run_at": %q, "steps": [{"name": "a", "handler": "h"}]}`,
		runAt.Format(time.RFC3339)))
	var status string
	var next *time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT execution_status, next_attempt_at
		FROM stepready.task_execution_context($1, $2)`, taskID, testBase).Scan(&status, &next))
	require.Equal(t, "scheduled", status)
	require.True(t, runAt.Equal(*next))
}

// A task scheduled for next year costs nothing until then: with thousands of scheduled steps in the tables,
// claim_ready_steps and next_claim_at read about as many rows as there are ready steps.
func TestRunAtClaimCostFollowsReadySteps(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	conn := b.db.Conn(t)
	ctx := t.Context()
	asOf := testBase
	_, err := conn.Exec(ctx, `WITH t AS (INSERT INTO stepready.tasks (name, run_at)
			SELECT 'next-year', $1::timestamptz FROM generate_series(1, 3000) RETURNING id)
		INSERT INTO stepready.steps (task_id, name, handler) SELECT id, 's', 'noop' FROM t`, asOf.AddDate(1, 0, 0))
	require.NoError(t, err)
	const ready = 5
	for i := range ready {
		_, err := conn.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`,
			fmt.Sprintf(`{"name": "now%d", "steps": [{"name": "a", "handler": "noop"}]}`, i))
		require.NoError(t, err)
	}
	_, err = conn.Exec(ctx, `VACUUM (ANALYZE) stepready.steps, stepready.tasks`)
	require.NoError(t, err)

	before := stepsTuplesRead(t, conn)
	var claimed int64
	require.NoError(t, conn.QueryRow(ctx,
		`SELECT count(*) FROM stepready.claim_ready_steps(100, 'w', 60000, $1)`, asOf).Scan(&claimed))
	read := stepsTuplesRead(t, conn) - before
	require.Equal(t, int64(ready), claimed)
	require.LessOrEqual(t, read, int64(10*ready+50), "tuples of steps read by one claim (3005 in the table)")

	before = stepsTuplesRead(t, conn)
	var next time.Time
	require.NoError(t, conn.QueryRow(ctx, `SELECT stepready.next_claim_at($1)`, asOf).Scan(&next))
	read = stepsTuplesRead(t, conn) - before
	require.True(t, asOf.AddDate(1, 0, 0).Equal(next))
	require.LessOrEqual(t, read, int64(10), "next_claim_at reads the first scheduled entry only")
}

// A delayed task stays delayed through operators: cancelled then reset, or retried now, before its run_at, its
// first attempt still waits for run_at (SPEC §15: no step of the task is claimable before it). Before, both
// cleared the delay and the step ran at once.
func TestRunAtSurvivesResetAndRetryNow(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	runAt := testBase.Add(time.Hour)
	taskID, ids := b.task(fmt.Sprintf(`{"name": "later", "run_at": %q, "steps": [{"name": "a", "handler": "h"}]}`,
		runAt.Format(time.RFC3339)))
	b.exec(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, testBase)
	b.exec(`SELECT stepready.reset_task($1, $2)`, taskID, testBase)
	claimable := func(at time.Time) int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.steps
			WHERE id = $1 AND COALESCE(next_attempt_at, '-infinity') <= $2`, ids["a"], at).Scan(&n))
		return n
	}
	require.Zero(t, claimable(testBase), "reset keeps the first attempt at run_at")
	b.requireNotReady(ids["a"], testBase, "scheduled")
	b.exec(`SELECT stepready.retry_step_now($1, $2)`, ids["a"], testBase)
	require.Zero(t, claimable(testBase.Add(time.Minute)), "retry now keeps the first attempt at run_at")
	b.requireNotReady(ids["a"], testBase.Add(time.Minute), "scheduled")
	require.Equal(t, 1, claimable(runAt))
	b.requireReady(ids["a"], runAt)
}

// create_task_from_template and create_tasks_from_template take p_run_at: the tasks they create start no earlier
// (over a template's own run_at), one an idempotency key finds keeps its run_at, and NULL leaves the template's.
func TestRunAtFromTemplate(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	own := testBase.Add(5 * time.Minute)
	b.exec(`INSERT INTO stepready.task_templates (name, definition) VALUES ('plain', $1::jsonb), ('timed', $2::jsonb)`,
		`{"steps": [{"name": "a", "handler": "h"}]}`,
		fmt.Sprintf(`{"run_at": %q, "steps": [{"name": "a", "handler": "h"}]}`, own.Format(time.RFC3339)))
	runAt := testBase.Add(time.Hour)
	runAtOf := func(taskID int64) *time.Time {
		var got *time.Time
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT run_at FROM stepready.tasks WHERE id = $1`, taskID).Scan(&got))
		return got
	}
	stepOf := func(taskID int64) int64 {
		var id int64
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT id FROM stepready.steps WHERE task_id = $1`, taskID).Scan(&id))
		return id
	}
	for _, tc := range []struct {
		name     string
		template string
		runAt    *time.Time
		want     *time.Time
	}{
		{"no run_at", "plain", nil, nil},
		{"p_run_at", "plain", &runAt, &runAt},
		{"the template's own", "timed", nil, &own},
		{"p_run_at over the template's", "timed", &runAt, &runAt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var one int64
			require.NoError(t, b.db.Pool.QueryRow(b.ctx,
				`SELECT stepready.create_task_from_template($1, NULL, NULL, $2)`, tc.template, tc.runAt).Scan(&one))
			rows, err := b.db.Pool.Query(b.ctx, `SELECT task_id FROM stepready.create_tasks_from_template($1,
				'[{}, {}]', NULL, $2)`, tc.template, tc.runAt)
			require.NoError(t, err)
			var many []int64
			for rows.Next() {
				var id int64
				require.NoError(t, rows.Scan(&id))
				many = append(many, id)
			}
			require.NoError(t, rows.Err())
			require.Len(t, many, 2)
			for _, id := range append(many, one) {
				got := runAtOf(id)
				if tc.want == nil {
					require.Nil(t, got)
					b.requireReady(stepOf(id), testBase)
					continue
				}
				require.NotNil(t, got)
				require.True(t, tc.want.Equal(*got), "run_at %s, want %s", got, tc.want)
				b.requireNotReady(stepOf(id), tc.want.Add(-tick), "scheduled")
				b.requireReady(stepOf(id), *tc.want)
			}
		})
	}

	// An idempotency key that finds a task leaves its run_at alone.
	var first, again int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT stepready.create_task_from_template('plain', NULL, 'k', NULL)`).Scan(&first))
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT stepready.create_task_from_template('plain', NULL, 'k', $1)`, runAt).Scan(&again))
	require.Equal(t, first, again)
	require.Nil(t, runAtOf(first))
}
