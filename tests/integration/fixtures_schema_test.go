package integration

// Fixtures of the SQL boundary tests, part 1 (retry, readiness, execution context, definitions, claim index).
// Every identifier here starts with p1 so that the other test files of the package can define their own.

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// schemaBundle is the fixture of the schema-level tests (definitions, policy resolution, plain-SQL rows,
// readiness, execution context): a database of the test's own, with helpers to write rows and read readiness.
// The lifecycle tests (claims, attempts, failures, events) use lifecycleBundle (fixtures_lifecycle_test.go).
type schemaBundle struct {
	t  *testing.T
	db *pgtest.DB
}

// schemaSetup gives t a fresh migrated database.
func schemaSetup(t *testing.T) *schemaBundle {
	t.Helper()
	return &schemaBundle{t: t, db: pgtest.New(t)}
}

// on returns a bundle for subtest t that shares b's database (the parent's cleanup drops it after every
// parallel subtest has finished).
func (b *schemaBundle) on(t *testing.T) *schemaBundle {
	return &schemaBundle{t: t, db: b.db}
}

// exec runs one statement and fails the test on error.
func (b *schemaBundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.db.Pool.Exec(b.t.Context(), sql, args...)
	require.NoError(b.t, err, sql)
}

// execErr runs one statement and returns its error.
func (b *schemaBundle) execErr(sql string, args ...any) error {
	b.t.Helper()
	_, err := b.db.Pool.Exec(b.t.Context(), sql, args...)
	return err
}

// int64 runs a query returning one bigint-compatible value.
func (b *schemaBundle) int64(sql string, args ...any) int64 {
	b.t.Helper()
	var v int64
	require.NoError(b.t, b.db.Pool.QueryRow(b.t.Context(), sql, args...).Scan(&v), sql)
	return v
}

// createTask calls stepready.create_task and returns the task id.
func (b *schemaBundle) createTask(definition string) int64 {
	b.t.Helper()
	return b.int64(`SELECT stepready.create_task($1::jsonb)`, definition)
}

// createTaskErr calls stepready.create_task and returns its error.
func (b *schemaBundle) createTaskErr(definition string) error {
	b.t.Helper()
	return b.execErr(`SELECT stepready.create_task($1::jsonb)`, definition)
}

// stepIDs maps step name to id for one task.
func (b *schemaBundle) stepIDs(taskID int64) map[string]int64 {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(), `SELECT name, id FROM stepready.steps WHERE task_id = $1`, taskID)
	require.NoError(b.t, err)
	ids := map[string]int64{}
	var (
		name string
		id   int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &id}, func() error {
		ids[name] = id
		return nil
	})
	require.NoError(b.t, err)
	return ids
}

// insertTask inserts a task with plain SQL and returns its id.
func (b *schemaBundle) insertTask(name string) int64 {
	b.t.Helper()
	return b.int64(`INSERT INTO stepready.tasks (name) VALUES ($1) RETURNING id`, name)
}

// insertStep inserts a pending step with plain SQL (policy from the presets) and returns its id.
func (b *schemaBundle) insertStep(taskID int64, name string) int64 {
	b.t.Helper()
	return b.int64(`INSERT INTO stepready.steps (task_id, name, handler) VALUES ($1, $2, 'noop') RETURNING id`,
		taskID, name)
}

// insertEdge makes child depend on parent.
func (b *schemaBundle) insertEdge(parent, child int64) {
	b.t.Helper()
	b.exec(`INSERT INTO stepready.step_edges (parent_step_id, child_step_id) VALUES ($1, $2)`, parent, child)
}

// setStep updates one step: set is a SET list whose parameters start at $2 ($1 is the step id). Triggers keep
// the counters right, so this puts a step in any state.
func (b *schemaBundle) setStep(stepID int64, set string, args ...any) {
	b.t.Helper()
	b.exec(`UPDATE stepready.steps SET `+set+` WHERE id = $1`, append([]any{stepID}, args...)...)
}

// setTask updates one task like setStep.
func (b *schemaBundle) setTask(taskID int64, set string, args ...any) {
	b.t.Helper()
	b.exec(`UPDATE stepready.tasks SET `+set+` WHERE id = $1`, append([]any{taskID}, args...)...)
}

// count returns the number of rows of a stepready table.
func (b *schemaBundle) count(table string) int64 {
	b.t.Helper()
	return b.int64(`SELECT count(*) FROM stepready.` + table)
}

// rowCounts is the number of rows of the tables a task definition writes.
type rowCounts struct{ Tasks, Steps, Edges, Events int64 }

func (b *schemaBundle) counts() rowCounts {
	b.t.Helper()
	return rowCounts{
		Tasks:  b.count("tasks"),
		Steps:  b.count("steps"),
		Edges:  b.count("step_edges"),
		Events: b.count("step_events"),
	}
}

// readinessRow is one row of stepready.step_readiness; the db tags are the documented column names, and
// pgx.RowToStructByName fails when the function returns any other set of columns.
type readinessRow struct {
	TaskID                int64      `db:"task_id"`
	StepID                int64      `db:"step_id"`
	Name                  string     `db:"name"`
	State                 string     `db:"state"`
	Attempts              int32      `db:"attempts"`
	MaxAttempts           *int32     `db:"max_attempts"`
	Retryable             *bool      `db:"retryable"`
	TotalParents          int32      `db:"total_parents"`
	CompletedParents      int32      `db:"completed_parents"`
	DependenciesSatisfied bool       `db:"dependencies_satisfied"`
	RetryEligible         bool       `db:"retry_eligible"`
	NextAttemptAt         *time.Time `db:"next_attempt_at"`
	Ready                 bool       `db:"ready"`
	BlockedReason         *string    `db:"blocked_reason"`
}

// readinessColumns is the result of step_readiness as SPEC §5 lists it, in order.
var readinessColumns = []string{"task_id", "step_id", "name", "state", "attempts", "max_attempts", "retryable",
	"total_parents", "completed_parents", "dependencies_satisfied", "retry_eligible", "next_attempt_at", "ready",
	"blocked_reason"}

// readiness calls step_readiness; stepIDs nil means no filter.
func (b *schemaBundle) readiness(taskIDs, stepIDs []int64, asOf time.Time) []readinessRow {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(),
		`SELECT * FROM stepready.step_readiness($1::bigint[], $2::bigint[], $3)`, taskIDs, stepIDs, asOf)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[readinessRow])
	require.NoError(b.t, err)
	return out
}

// readinessByName calls step_readiness for one task and indexes the rows by step name.
func (b *schemaBundle) readinessByName(taskID int64, asOf time.Time) map[string]readinessRow {
	b.t.Helper()
	byName := map[string]readinessRow{}
	for _, r := range b.readiness([]int64{taskID}, nil, asOf) {
		byName[r.Name] = r
	}
	return byName
}

// stepReadiness returns the readiness row of one step.
func (b *schemaBundle) stepReadiness(taskID, stepID int64, asOf time.Time) readinessRow {
	b.t.Helper()
	rows := b.readiness([]int64{taskID}, []int64{stepID}, asOf)
	require.Len(b.t, rows, 1)
	return rows[0]
}

// requirePendingParentsInvariant checks the invariant the claim index relies on: for every step of the tasks,
// the trigger-maintained steps.pending_parents equals total_parents - completed_parents as step_readiness
// computes it from the tables.
func (b *schemaBundle) requirePendingParentsInvariant(taskIDs []int64, asOf time.Time) {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(), `
		SELECT r.name, s.pending_parents, r.total_parents - r.completed_parents
		  FROM stepready.step_readiness($1::bigint[], NULL, $2) r
		  JOIN stepready.steps s ON s.id = r.step_id
		 ORDER BY r.step_id`, taskIDs, asOf)
	require.NoError(b.t, err)
	var (
		name           string
		counted, truth int32
		n              int
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &counted, &truth}, func() error {
		n++
		require.Equalf(b.t, truth, counted, "step %q: steps.pending_parents = %d, step_readiness says %d unsatisfied",
			name, counted, truth)
		return nil
	})
	require.NoError(b.t, err)
	require.Positive(b.t, n, "the invariant was checked on no step")
}

// execContextRow is the row of stepready.task_execution_context.
type execContextRow struct {
	TaskID               int64      `db:"task_id"`
	Status               string     `db:"status"`
	TotalSteps           int32      `db:"total_steps"`
	PendingSteps         int32      `db:"pending_steps"`
	InFlightSteps        int32      `db:"in_flight_steps"`
	WaitingForRetrySteps int32      `db:"waiting_for_retry_steps"`
	CompletedSteps       int32      `db:"completed_steps"`
	ErrorSteps           int32      `db:"error_steps"`
	SkippedSteps         int32      `db:"skipped_steps"`
	CancelledSteps       int32      `db:"cancelled_steps"`
	ReadySteps           int32      `db:"ready_steps"`
	NextAttemptAt        *time.Time `db:"next_attempt_at"`
	ExecutionStatus      string     `db:"execution_status"`
}

// execContextColumns is the result of task_execution_context as SPEC §5 lists it, in order.
var execContextColumns = []string{"task_id", "status", "total_steps", "pending_steps", "in_flight_steps",
	"waiting_for_retry_steps", "completed_steps", "error_steps", "skipped_steps", "cancelled_steps", "ready_steps",
	"next_attempt_at", "execution_status"}

// execContexts calls task_execution_context and returns every row (one, or none for an unknown task).
func (b *schemaBundle) execContexts(taskID int64, asOf time.Time) []execContextRow {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(), `SELECT * FROM stepready.task_execution_context($1, $2)`,
		taskID, asOf)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[execContextRow])
	require.NoError(b.t, err)
	return out
}

// execContext returns the one row of task_execution_context.
func (b *schemaBundle) execContext(taskID int64, asOf time.Time) execContextRow {
	b.t.Helper()
	rows := b.execContexts(taskID, asOf)
	require.Len(b.t, rows, 1)
	return rows[0]
}

// columnNames returns the names of the result columns of a query, in order.
func (b *schemaBundle) columnNames(sql string, args ...any) []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(), sql, args...)
	require.NoError(b.t, err)
	defer rows.Close()
	var names []string
	for _, fd := range rows.FieldDescriptions() {
		names = append(names, fd.Name)
	}
	rows.Close()
	require.NoError(b.t, rows.Err())
	return names
}

// requirePgError requires err to be a PostgreSQL error with SQLSTATE code whose message contains every
// fragment, and returns it.
func requirePgError(t testing.TB, err error, code string, fragments ...string) *pgconn.PgError {
	t.Helper()
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "not a PostgreSQL error: %v", err)
	require.Equal(t, code, pgErr.Code, "SQLSTATE of %q", pgErr.Message)
	for _, f := range fragments {
		require.Contains(t, pgErr.Message, f)
	}
	return pgErr
}

// requireOneOfCodes is requirePgError for a contract that allows several SQLSTATEs.
func requireOneOfCodes(t testing.TB, err error, codes []string, fragments ...string) *pgconn.PgError {
	t.Helper()
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "not a PostgreSQL error: %v", err)
	require.Contains(t, codes, pgErr.Code, "SQLSTATE of %q", pgErr.Message)
	for _, f := range fragments {
		require.Contains(t, pgErr.Message, f)
	}
	return pgErr
}

// requireTimeIs requires a nullable timestamp to be set and equal to want (compared as instants).
func requireTimeIs(t testing.TB, want time.Time, got *time.Time, msgAndArgs ...any) {
	t.Helper()
	require.NotNil(t, got, msgAndArgs...)
	require.Truef(t, want.Equal(*got), "want %s, got %s", want.UTC().Format(time.RFC3339Nano),
		got.UTC().Format(time.RFC3339Nano))
}

// str renders a nullable value for a subtest name.
func str[T any](p *T) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprint(*p)
}
