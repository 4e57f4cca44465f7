package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// retention is a database with helpers for the retention tests; times are pinned with p_as_of.
type retention struct {
	t  *testing.T
	db *pgtest.DB
}

func newRetention(t *testing.T) *retention {
	t.Helper()
	return &retention{t: t, db: pgtest.New(t)}
}

func (r *retention) exec(sql string, args ...any) {
	r.t.Helper()
	_, err := r.db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(r.t, err, sql)
}

func (r *retention) int64(sql string, args ...any) int64 {
	r.t.Helper()
	var n int64
	require.NoError(r.t, r.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n), sql)
	return n
}

// task creates a one-step task and returns its id and its step's id.
func (r *retention) task(name string) (int64, int64) {
	r.t.Helper()
	id := r.int64(`SELECT stepready.create_task($1::jsonb)`, mustJSON(r.t, chainDef(name, 1, "")))
	return id, r.int64(`SELECT id FROM stepready.steps WHERE task_id = $1`, id)
}

// run claims and starts the task's step at `at` and returns its attempt.
func (r *retention) start(step int64, at time.Time) int {
	r.t.Helper()
	r.exec(`SELECT stepready.claim_ready_steps(1000, 'w', 60000, $1)`, at)
	return int(r.int64(`SELECT stepready.start_step($1, 'w', 60000, $2)`, step, at))
}

// completedAt is the task's status and completed_at.
func (r *retention) completedAt(task int64) (string, *time.Time) {
	r.t.Helper()
	var status string
	var at *time.Time
	require.NoError(r.t, r.db.Pool.QueryRow(context.Background(),
		`SELECT status, completed_at FROM stepready.tasks WHERE id = $1`, task).Scan(&status, &at))
	return status, at
}

// TestTaskCompletedAtFollowsTerminalStatus: completed_at is set when a task reaches complete, error or
// cancelled, at the time of the change that made it so, and cleared when it is reopened (SPEC §13).
func TestTaskCompletedAtFollowsTerminalStatus(t *testing.T) {
	t.Parallel()
	r := newRetention(t)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	done, s1 := r.task("done")
	a := r.start(s1, t0)
	r.exec(`SELECT stepready.complete_step($1, $2, '{}', $3)`, s1, a, t0.Add(time.Second))
	status, at := r.completedAt(done)
	require.Equal(t, "complete", status)
	require.NotNil(t, at)
	require.True(t, at.Equal(t0.Add(time.Second)), "completed_at %s", at)

	failed, s2 := r.task("failed")
	a = r.start(s2, t0)
	r.exec(`SELECT * FROM stepready.fail_step($1, $2, '{"class": "permanent"}', $3)`, s2, a, t0.Add(2*time.Second))
	status, at = r.completedAt(failed)
	require.Equal(t, "error", status)
	require.NotNil(t, at, "an error task has finished")
	require.True(t, at.Equal(t0.Add(2*time.Second)), "completed_at %s", at)

	// Reopened by retry_step_now: in_progress again, completed_at cleared.
	r.exec(`SELECT stepready.retry_step_now($1, $2)`, s2, t0.Add(3*time.Second))
	status, at = r.completedAt(failed)
	require.Equal(t, "in_progress", status)
	require.Nil(t, at)

	cancelled, _ := r.task("cancelled")
	r.exec(`SELECT stepready.cancel_task($1, 'test', $2)`, cancelled, t0.Add(4*time.Second))
	status, at = r.completedAt(cancelled)
	require.Equal(t, "cancelled", status)
	require.NotNil(t, at)
	require.True(t, at.Equal(t0.Add(4*time.Second)), "completed_at %s", at)

	// Reopened by reset_task.
	r.exec(`SELECT stepready.reset_task($1, $2)`, cancelled, t0.Add(5*time.Second))
	status, at = r.completedAt(cancelled)
	require.NotEqual(t, "cancelled", status)
	require.Nil(t, at)

	pending, _ := r.task("pending")
	status, at = r.completedAt(pending)
	require.Equal(t, "pending", status)
	require.Nil(t, at)
}

// TestPruneTasks: prune_tasks deletes only terminal tasks of the given statuses that finished strictly before the
// cut-off, oldest first, at most p_limit, with their steps, edges and events, and returns how many.
func TestPruneTasks(t *testing.T) {
	t.Parallel()
	r := newRetention(t)
	ctx := context.Background()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	us := time.Microsecond

	finish := func(name string, at time.Time) int64 {
		id := r.int64(`SELECT stepready.create_task($1::jsonb)`, mustJSON(t, chainDef(name, 3, "")))
		for range 3 {
			var step int64
			var attempt int
			require.NoError(t, r.db.Pool.QueryRow(ctx, `SELECT step_id, attempt FROM stepready.claim_and_start_steps(1, 'w', 60000, $1)`,
				at).Scan(&step, &attempt))
			r.exec(`SELECT stepready.complete_step($1, $2, '{}', $3)`, step, attempt, at)
		}
		status, _ := r.completedAt(id)
		require.Equal(t, "complete", status)
		return id
	}
	old1 := finish("old1", t0)
	old2 := finish("old2", t0.Add(time.Second))
	recent := finish("recent", t0.Add(time.Hour))
	cancelled, _ := r.task("cancelled")
	r.exec(`SELECT stepready.cancel_task($1, 'x', $2)`, cancelled, t0)
	errored, es := r.task("errored")
	a := r.start(es, t0.Add(-time.Minute))
	r.exec(`SELECT * FROM stepready.fail_step($1, $2, '{"class": "permanent"}', $3)`, es, a, t0)
	pending, _ := r.task("pending")
	paused, _ := r.task("paused")
	r.exec(`SELECT stepready.pause_task($1, $2)`, paused, t0)
	running, rs := r.task("running")
	r.start(rs, t0)

	prune := func(before time.Time, statuses []string, limit int) int {
		t.Helper()
		var n int
		require.NoError(t, r.db.Pool.QueryRow(ctx, `SELECT stepready.prune_tasks($1, $2, $3)`, before, statuses, limit).Scan(&n))
		return n
	}
	exists := func(id int64) bool {
		return r.int64(`SELECT count(*) FROM stepready.tasks WHERE id = $1`, id) == 1
	}

	// The cut-off is strict: a task that finished at t0 survives a prune of tasks finished before t0.
	require.Equal(t, 0, prune(t0, []string{"complete", "cancelled"}, 1000))
	// One microsecond later, the oldest first and at most the limit: old1 (t0) before old2 (t0 + 1 s); the
	// cancelled task also finished at t0 (ties go by id).
	require.Equal(t, 2, prune(t0.Add(2*time.Second), []string{"complete", "cancelled"}, 2))
	require.False(t, exists(old1))
	require.True(t, exists(old2) != exists(cancelled), "exactly one of old2 and cancelled is left by the limit")
	require.Equal(t, 1, prune(t0.Add(2*time.Second+us), []string{"complete", "cancelled"}, 1000))
	require.False(t, exists(old2))
	require.False(t, exists(cancelled))

	// The default statuses leave error tasks; naming error prunes it.
	require.True(t, exists(errored))
	var n int
	require.NoError(t, r.db.Pool.QueryRow(ctx, `SELECT stepready.prune_tasks($1)`, t0.Add(24*time.Hour)).Scan(&n))
	require.Equal(t, 1, n, "recent (complete) only")
	require.False(t, exists(recent))
	require.True(t, exists(errored))
	require.Equal(t, 1, prune(t0.Add(24*time.Hour), []string{"error"}, 1000))

	// Nothing unfinished is ever touched, whatever the cut-off.
	require.Equal(t, 0, prune(t0.Add(100*365*24*time.Hour), []string{"complete", "cancelled", "error"}, 1000))
	for _, id := range []int64{pending, paused, running} {
		require.True(t, exists(id))
	}
	// Steps, edges and events went with their tasks.
	require.Equal(t, int64(3), r.int64(`SELECT count(*) FROM stepready.steps`), "the steps of pending, paused, running")
	require.Zero(t, r.int64(`SELECT count(*) FROM stepready.step_edges`))
	require.Zero(t, r.int64(`SELECT count(*) FROM stepready.step_events WHERE task_id NOT IN (SELECT id FROM stepready.tasks)`))
	require.Positive(t, r.int64(`SELECT count(*) FROM stepready.step_events`), "the remaining tasks keep theirs")

	for _, tc := range []struct {
		name, sql, want string
	}{
		{"unfinished status", `SELECT stepready.prune_tasks(now(), '{complete,pending}')`, `status 'pending': only finished tasks`},
		{"negative limit", `SELECT stepready.prune_tasks(now(), '{complete}', -1)`, `p_limit must be >= 0, got -1`},
		{"no cut-off", `SELECT stepready.prune_tasks(NULL)`, `p_finished_before must not be NULL`},
	} {
		_, err := r.db.Pool.Exec(ctx, tc.sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, tc.name)
		require.Equal(t, "22023", pgErr.Code, tc.name)
		require.Contains(t, pgErr.Message, tc.want, tc.name)
	}
	require.Equal(t, 0, prune(t0, []string{"complete"}, 0), "a limit of 0 deletes nothing")
}

// TestPruneDoesNotBlockClaims: while a prune of 10,000 finished tasks has deleted them but not committed, claims
// of other tasks' steps return at once (a short lock_timeout would fail them otherwise), and a second pruner
// skips the locked tasks instead of waiting (RELIABILITY #12).
func TestPruneDoesNotBlockClaims(t *testing.T) {
	t.Parallel()
	r := newRetention(t)
	ctx := context.Background()
	// 10,000 complete tasks of 2 steps with events, loaded by SQL, and 20 ready one-step tasks.
	for _, sql := range []string{
		`INSERT INTO stepready.tasks (name) SELECT 'old' FROM generate_series(1, 10000)`,
		`INSERT INTO stepready.steps (task_id, name, handler, state, attempts)
			SELECT t.id, 's' || g, 'noop', 'complete', 1 FROM stepready.tasks t, generate_series(1, 2) g`,
		`INSERT INTO stepready.step_events (task_id, step_id, attempt, event) SELECT task_id, id, 1, 'step.completed'
			FROM stepready.steps`,
		`INSERT INTO stepready.tasks (name) SELECT 'new' FROM generate_series(1, 20)`,
		`INSERT INTO stepready.steps (task_id, name, handler) SELECT id, 's', 'noop' FROM stepready.tasks WHERE name = 'new'`,
	} {
		r.exec(sql)
	}
	require.Equal(t, int64(10000), r.int64(`SELECT count(*) FROM stepready.tasks WHERE status = 'complete' AND completed_at IS NOT NULL`))

	pruner, err := r.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = pruner.Rollback(ctx) }()
	var n int
	require.NoError(t, pruner.QueryRow(ctx, `SELECT stepready.prune_tasks(now() + interval '1 hour', '{complete}', 10000)`).Scan(&n))
	require.Equal(t, 10000, n)

	// The prune's transaction is open, holding every lock it took.
	claimer := r.db.Conn(t)
	_, err = claimer.Exec(ctx, `SET lock_timeout = '200ms'`)
	require.NoError(t, err)
	rows, err := claimer.Query(ctx, `SELECT step_id FROM stepready.claim_ready_steps(10, 'w', 60000)`)
	require.NoError(t, err)
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err, "a claim waited on the prune")
	require.Len(t, claimed, 10)
	rows, err = claimer.Query(ctx, `SELECT step_id FROM stepready.claim_and_start_steps(10, 'w', 60000)`)
	require.NoError(t, err)
	started, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err, "a claim waited on the prune")
	require.Len(t, started, 10)
	// A second pruner does not wait either: the locked tasks are skipped.
	var second int
	require.NoError(t, claimer.QueryRow(ctx, `SELECT stepready.prune_tasks(now() + interval '1 hour', '{complete}', 10000)`).Scan(&second))
	require.Zero(t, second)

	require.NoError(t, pruner.Commit(ctx))
	require.Equal(t, int64(20), r.int64(`SELECT count(*) FROM stepready.tasks`))
	require.Zero(t, r.int64(`SELECT count(*) FROM stepready.step_events WHERE task_id NOT IN (SELECT id FROM stepready.tasks)`))
}
