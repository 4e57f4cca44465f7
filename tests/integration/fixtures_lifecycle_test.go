package integration

// Fixtures of the SQL boundary tests, part 2 (lifecycle and operator functions). Every name here starts with
// lc (lifecycle) so it cannot clash with the fixtures of part 1 in the same package.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// testBase is the pinned "now" of the lifecycle tests. Every function call passes p_as_of explicitly; offsets
// from testBase express time, nothing sleeps.
var testBase = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// tick is the resolution of timestamptz: the smallest step of a boundary test.
const tick = time.Microsecond

const (
	testWorker  = "worker-1"
	testLeaseMs = int64(60000)
	testLease   = 60 * time.Second
)

// lifecycleBundle is the fixture of the lifecycle tests (claims, attempts, outcomes, operators, events): a fresh
// migrated database, a context that ends with the test, and helpers that read steps, tasks and events.
type lifecycleBundle struct {
	t   *testing.T
	db  *pgtest.DB
	ctx context.Context
}

func lifecycleSetup(t *testing.T) *lifecycleBundle {
	t.Helper()
	return &lifecycleBundle{t: t, db: pgtest.New(t), ctx: t.Context()}
}

// lifecycleStep is the part of a steps row the tests look at.
type lifecycleStep struct {
	ID                 int64
	TaskID             int64
	Name               string
	State              string
	Attempts           int
	MaxAttempts        int
	Retryable          bool
	NextAttemptAt      *time.Time
	LastAttemptedAt    *time.Time
	LeaseOwner         *string
	LeaseExpiresAt     *time.Time
	Input              string
	Output             *string
	LastError          *string
	Iteration          int
	PendingParents     int
	BreakerCount       int
	BreakerFingerprint *string
	CompletedAt        *time.Time
	FenceToken         int
}

const lifecycleStepColumns = `id, task_id, name, state, attempts, max_attempts, retryable, next_attempt_at,
	last_attempted_at, lease_owner, lease_expires_at, input::text AS input, output::text AS output,
	last_error::text AS last_error, iteration, pending_parents, breaker_count, breaker_fingerprint, completed_at,
	fence_token`

type lifecycleTask struct {
	ID          int64
	Status      string
	Paused      bool
	CompletedAt *time.Time
}

type lifecycleEvent struct {
	ID        int64
	StepID    *int64
	Attempt   *int
	Iteration *int
	Event     string
	FromState *string
	ToState   *string
	Details   map[string]any
	At        time.Time
}

// claimedRow is one row of claim_ready_steps.
type claimedRow struct {
	StepID    int64
	TaskID    int64
	Name      string
	Handler   string
	Input     string
	Attempts  int
	TimeoutMs *int64
	Queue     string
}

// failResult is the row fail_step returns.
type failResult struct {
	State         *string
	NextAttemptAt *time.Time
	Reason        *string
}

func (b *lifecycleBundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, sql, args...)
	require.NoError(b.t, err, sql)
}

// task creates a task with stepready.create_task and returns its id and its step ids by name.
func (b *lifecycleBundle) task(definition string) (int64, map[string]int64) {
	b.t.Helper()
	var id int64
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.create_task($1::jsonb)`, definition).Scan(&id),
		definition)
	return id, b.stepIDs(id)
}

// oneStep creates a task named "t" with one step named "s" whose definition gets the extra JSON fields given
// (without braces, e.g. `"retry": {"max_attempts": 1}`), and returns the task and step ids.
func (b *lifecycleBundle) oneStep(extra string) (int64, int64) {
	b.t.Helper()
	if extra != "" {
		extra = ", " + extra
	}
	taskID, ids := b.task(`{"name": "t", "steps": [{"name": "s", "handler": "h"` + extra + `}]}`)
	return taskID, ids["s"]
}

func (b *lifecycleBundle) stepIDs(taskID int64) map[string]int64 {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT name, id FROM stepready.steps WHERE task_id = $1`, taskID)
	require.NoError(b.t, err)
	ids := map[string]int64{}
	var name string
	var id int64
	_, err = pgx.ForEachRow(rows, []any{&name, &id}, func() error { ids[name] = id; return nil })
	require.NoError(b.t, err)
	return ids
}

func (b *lifecycleBundle) step(id int64) lifecycleStep {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT `+lifecycleStepColumns+` FROM stepready.steps WHERE id = $1`, id)
	require.NoError(b.t, err)
	s, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[lifecycleStep])
	require.NoError(b.t, err, "step %d", id)
	return s
}

func (b *lifecycleBundle) taskRow(id int64) lifecycleTask {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx,
		`SELECT id, status, paused, completed_at FROM stepready.tasks WHERE id = $1`, id)
	require.NoError(b.t, err)
	tk, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[lifecycleTask])
	require.NoError(b.t, err, "task %d", id)
	return tk
}

func (b *lifecycleBundle) requireState(stepID int64, want string) {
	b.t.Helper()
	require.Equal(b.t, want, b.step(stepID).State, "state of step %d", stepID)
}

func (b *lifecycleBundle) requireStatus(taskID int64, want string) {
	b.t.Helper()
	require.Equal(b.t, want, b.taskRow(taskID).Status, "status of task %d", taskID)
}

// snapshot is the whole step row plus how many events it has: equal snapshots mean a call changed nothing.
func (b *lifecycleBundle) snapshot(stepID int64) string {
	b.t.Helper()
	var row string
	var events int
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `
		SELECT (SELECT to_jsonb(s)::text FROM stepready.steps s WHERE s.id = $1),
		       (SELECT count(*) FROM stepready.step_events e WHERE e.step_id = $1)`, stepID).Scan(&row, &events))
	return fmt.Sprintf("%s events=%d", row, events)
}

// taskSnapshotBeyondLeases is taskSnapshot without the lease columns of steps outside flight and their
// updated_at: what a refused call may change when it ends its attempt's orphaned lease (sql/046_leases.sql).
func (b *lifecycleBundle) taskSnapshotBeyondLeases(taskID int64) string {
	b.t.Helper()
	var s string
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `
		SELECT (SELECT to_jsonb(t)::text FROM stepready.tasks t WHERE t.id = $1)
		    || (SELECT COALESCE(string_agg(CASE WHEN s.state IN ('enqueued', 'in_progress') THEN to_jsonb(s)
		                                         ELSE to_jsonb(s) - 'lease_owner' - 'lease_expires_at' - 'updated_at'
		                                    END::text, ',' ORDER BY s.id), '')
		          FROM stepready.steps s WHERE s.task_id = $1)
		    || (SELECT count(*) FROM stepready.step_events e WHERE e.task_id = $1)::text`, taskID).Scan(&s))
	return s
}

// taskSnapshot is every step row of a task, its task row and its event count.
func (b *lifecycleBundle) taskSnapshot(taskID int64) string {
	b.t.Helper()
	var s string
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `
		SELECT (SELECT to_jsonb(t)::text FROM stepready.tasks t WHERE t.id = $1)
		    || (SELECT COALESCE(string_agg(to_jsonb(s)::text, ',' ORDER BY s.id), '') FROM stepready.steps s
		         WHERE s.task_id = $1)
		    || (SELECT count(*) FROM stepready.step_events e WHERE e.task_id = $1)::text`, taskID).Scan(&s))
	return s
}

func (b *lifecycleBundle) collectEvents(sql string, arg int64) []lifecycleEvent {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT id, step_id, attempt, iteration, event, from_state, to_state,
		details, at FROM stepready.step_events WHERE `+sql+` ORDER BY id`, arg)
	require.NoError(b.t, err)
	evs, err := pgx.CollectRows(rows, pgx.RowToStructByName[lifecycleEvent])
	require.NoError(b.t, err)
	return evs
}

// events returns the events of a step, oldest first.
func (b *lifecycleBundle) events(stepID int64) []lifecycleEvent {
	b.t.Helper()
	return b.collectEvents(`step_id = $1`, stepID)
}

// taskEvents returns the task-level events of a task (step_id NULL), oldest first.
func (b *lifecycleBundle) taskEvents(taskID int64) []lifecycleEvent {
	b.t.Helper()
	return b.collectEvents(`task_id = $1 AND step_id IS NULL`, taskID)
}

// lastEvents returns the names of the last n events of a step.
func (b *lifecycleBundle) lastEvents(stepID int64, n int) []lifecycleEvent {
	b.t.Helper()
	evs := b.events(stepID)
	require.GreaterOrEqual(b.t, len(evs), n, "step %d has %d events", stepID, len(evs))
	return evs[len(evs)-n:]
}

func eventNames(evs []lifecycleEvent) []string {
	names := make([]string, len(evs))
	for i, e := range evs {
		names[i] = e.Event
	}
	return names
}

// readiness returns step_readiness(ready, blocked_reason) of one step at asOf.
func (b *lifecycleBundle) readiness(stepID int64, asOf time.Time) (bool, *string) {
	b.t.Helper()
	var ready bool
	var reason *string
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `
		SELECT r.ready, r.blocked_reason
		  FROM stepready.steps s, stepready.step_readiness(ARRAY[s.task_id], ARRAY[s.id], $2) r
		 WHERE s.id = $1`, stepID, asOf).Scan(&ready, &reason))
	return ready, reason
}

func (b *lifecycleBundle) requireReady(stepID int64, asOf time.Time) {
	b.t.Helper()
	ready, reason := b.readiness(stepID, asOf)
	require.True(b.t, ready, "step %d should be ready at %s, blocked: %v", stepID, asOf, deref(reason))
}

func (b *lifecycleBundle) requireNotReady(stepID int64, asOf time.Time, wantReason string) {
	b.t.Helper()
	ready, reason := b.readiness(stepID, asOf)
	require.False(b.t, ready, "step %d should not be ready at %s", stepID, asOf)
	require.Equal(b.t, wantReason, deref(reason), "blocked_reason of step %d at %s", stepID, asOf)
}

// claimAs calls claim_ready_steps and returns its rows.
func (b *lifecycleBundle) claimAs(q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, limit int, worker string, leaseMs int64, asOf time.Time) ([]claimedRow, error) {
	rows, err := q.Query(b.ctx,
		`SELECT step_id, task_id, name, handler, input::text AS input, attempts, timeout_ms, queue
		   FROM stepready.claim_ready_steps($1, $2, $3, $4)`, limit, worker, leaseMs, asOf)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByName[claimedRow])
}

func (b *lifecycleBundle) claim(limit int, asOf time.Time) []claimedRow {
	b.t.Helper()
	got, err := b.claimAs(b.db.Pool, limit, testWorker, testLeaseMs, asOf)
	require.NoError(b.t, err)
	return got
}

// claimIDs claims every ready step at asOf and returns the claimed ids in claim order.
func (b *lifecycleBundle) claimIDs(asOf time.Time) []int64 {
	b.t.Helper()
	return claimedIDs(b.claim(1000, asOf))
}

func claimedIDs(rows []claimedRow) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.StepID
	}
	return ids
}

func (b *lifecycleBundle) start(stepID int64, asOf time.Time) *int {
	b.t.Helper()
	var attempt *int
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.start_step($1, $2, $3, $4)`,
		stepID, testWorker, testLeaseMs, asOf).Scan(&attempt))
	return attempt
}

// enqueue moves one ready step to enqueued the way a claim does, without claiming the other ready steps of the
// database: it checks step_readiness first, so a fixture can never enqueue a step that is not ready.
func (b *lifecycleBundle) enqueue(stepID int64, asOf time.Time) {
	b.t.Helper()
	b.requireReady(stepID, asOf)
	b.exec(`UPDATE stepready.steps SET state = 'enqueued', lease_owner = $2, lease_expires_at = $3 WHERE id = $1`,
		stepID, testWorker, asOf.Add(testLease))
}

// run enqueues a ready step and starts its next attempt at asOf; it returns the attempt number.
func (b *lifecycleBundle) run(stepID int64, asOf time.Time) int {
	b.t.Helper()
	b.enqueue(stepID, asOf)
	attempt := b.start(stepID, asOf)
	require.NotNil(b.t, attempt, "start_step of step %d returned NULL", stepID)
	return *attempt
}

func (b *lifecycleBundle) complete(stepID int64, attempt int, output string, asOf time.Time) bool {
	b.t.Helper()
	var ok bool
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.complete_step($1, $2, $3::jsonb, $4)`,
		stepID, attempt, output, asOf).Scan(&ok))
	return ok
}

// runToComplete runs one attempt of a ready step and completes it.
func (b *lifecycleBundle) runToComplete(stepID int64, output string, asOf time.Time) {
	b.t.Helper()
	attempt := b.run(stepID, asOf)
	require.True(b.t, b.complete(stepID, attempt, output, asOf))
}

func (b *lifecycleBundle) failErr(stepID int64, attempt int, errJSON string, asOf time.Time, sample float64) (failResult, error) {
	var r failResult
	err := b.db.Pool.QueryRow(b.ctx, `SELECT state, next_attempt_at, reason
		FROM stepready.fail_step($1, $2, $3::jsonb, $4, $5)`, stepID, attempt, errJSON, asOf, sample).
		Scan(&r.State, &r.NextAttemptAt, &r.Reason)
	return r, err
}

func (b *lifecycleBundle) fail(stepID int64, attempt int, errJSON string, asOf time.Time, sample float64) failResult {
	b.t.Helper()
	r, err := b.failErr(stepID, attempt, errJSON, asOf, sample)
	require.NoError(b.t, err)
	return r
}

// retryOnce runs one attempt at asOf, fails it with errJSON, requires a scheduled retry and returns when the
// step is due again.
func (b *lifecycleBundle) retryOnce(stepID int64, errJSON string, asOf time.Time) time.Time {
	b.t.Helper()
	attempt := b.run(stepID, asOf)
	r := b.fail(stepID, attempt, errJSON, asOf, 0)
	require.Equal(b.t, "waiting_for_retry", deref(r.State), "failure %s of attempt %d, reason %s", errJSON,
		attempt, deref(r.Reason))
	require.NotNil(b.t, r.NextAttemptAt)
	return *r.NextAttemptAt
}

func (b *lifecycleBundle) boolCall(sql string, args ...any) bool {
	b.t.Helper()
	var ok bool
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&ok), sql)
	return ok
}

func (b *lifecycleBundle) intCall(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&n), sql)
	return n
}

// callErr runs a statement and returns its error (for the calls that must fail).
func (b *lifecycleBundle) callErr(sql string, args ...any) error {
	rows, err := b.db.Pool.Query(b.ctx, sql, args...)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// requireSQLState requires err to be a PostgreSQL error with the given SQLSTATE whose message contains every
// one of contains.
func requireSQLState(t testing.TB, err error, code string, contains ...string) {
	t.Helper()
	require.Error(t, err, "want SQLSTATE %s", code)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want a PostgreSQL error, got %v", err)
	require.Equal(t, code, pgErr.Code, "SQLSTATE of %q", pgErr.Message)
	for _, c := range contains {
		require.Contains(t, pgErr.Message, c)
	}
}

// requireTime requires got to be non-NULL and the same instant as want.
func requireTime(t testing.TB, want time.Time, got *time.Time, what string) {
	t.Helper()
	require.NotNil(t, got, "%s is NULL, want %s", what, want)
	require.True(t, want.Equal(*got), "%s: want %s, got %s", what, want.UTC(), got.UTC())
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func ptr[T any](v T) *T { return &v }

// waitBlocked waits until the backend pid waits on a lock (a heavyweight lock: a row or a transaction id),
// polling with a deadline.
func (b *lifecycleBundle) waitBlocked(pid uint32) {
	b.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting bool
		require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity
			WHERE pid = $1 AND wait_event_type = 'Lock')`, int32(pid)).Scan(&waiting))
		if waiting {
			return
		}
		require.True(b.t, time.Now().Before(deadline), "backend %d never blocked on a lock", pid)
		select {
		case <-b.ctx.Done():
			b.t.Fatal(b.ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// requireSameTime requires two nullable timestamps to be both NULL or the same instant.
func requireSameTime(t testing.TB, want, got *time.Time, what string) {
	t.Helper()
	if want == nil {
		require.Nil(t, got, what)
		return
	}
	requireTime(t, *want, got, what)
}
