package readmodel_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/readmodel"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// recorder wraps a pool: it records the isolation of every transaction begun and the text of every statement,
// so tests can check that a read is one snapshot and that every query of queries.sql ran.
type recorder struct {
	db *pgtest.DB

	mu    sync.Mutex
	iso   []pgx.TxIsoLevel
	texts map[string]bool
}

func (r *recorder) note(sql string) {
	r.mu.Lock()
	r.texts[sql] = true
	r.mu.Unlock()
}

func (r *recorder) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.note(sql)
	return r.db.Pool.Exec(ctx, sql, args...)
}

func (r *recorder) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.note(sql)
	return r.db.Pool.Query(ctx, sql, args...)
}

func (r *recorder) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r.note(sql)
	return r.db.Pool.QueryRow(ctx, sql, args...)
}

func (r *recorder) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	r.mu.Lock()
	r.iso = append(r.iso, opts.IsoLevel)
	r.mu.Unlock()
	tx, err := r.db.Pool.BeginTx(ctx, opts)
	return recordingTx{Tx: tx, r: r}, err
}

type recordingTx struct {
	pgx.Tx
	r *recorder
}

func (t recordingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.r.note(sql)
	return t.Tx.Exec(ctx, sql, args...)
}

func (t recordingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.r.note(sql)
	return t.Tx.Query(ctx, sql, args...)
}

func (t recordingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.r.note(sql)
	return t.Tx.QueryRow(ctx, sql, args...)
}

func exec(t *testing.T, db *pgtest.DB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(t.Context(), sql, args...)
	require.NoError(t, err)
}

// diamond creates a task a → (b, c) → d, runs a to completion and fails b once with a retry in an hour.
func diamond(t *testing.T, db *pgtest.DB) (taskID int64, ids map[string]int64) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "diamond", "context": {"k": 1},
		"steps": [{"name": "a", "handler": "noop"}, {"name": "b", "handler": "noop", "depends_on": ["a"]},
		          {"name": "c", "handler": "noop", "depends_on": ["a"]},
		          {"name": "d", "handler": "noop", "depends_on": ["b", "c"]}]}')`).Scan(&taskID))
	ids = map[string]int64{}
	rows, err := db.Pool.Query(ctx, `SELECT name, id FROM stepready.steps WHERE task_id = $1`, taskID)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		var id int64
		require.NoError(t, rows.Scan(&n, &id))
		ids[n] = id
	}
	require.NoError(t, rows.Err())
	exec(t, db, `SELECT count(*) FROM stepready.claim_and_start_steps(1, 'w', 60000)`)
	exec(t, db, `SELECT stepready.complete_step($1, 1, '{"out": 1}')`, ids["a"])
	var claimed int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT step_id FROM stepready.claim_and_start_steps(1, 'w', 60000)`).
		Scan(&claimed))
	exec(t, db, `SELECT * FROM stepready.fail_step($1, 1, '{"class": "transient", "message": "boom", "retry_after_ms": 3600000}')`,
		claimed)
	return taskID, ids
}

// ReadTask returns the task, its steps with their readiness and first reason, its edges, attempts and events,
// read in one REPEATABLE READ snapshot.
func TestReadTask(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := &recorder{db: db, texts: map[string]bool{}}
	taskID, ids := diamond(t, db)

	d, err := readmodel.ReadTask(t.Context(), r, taskID, readmodel.TaskOptions{Attempts: true, Events: true,
		EventsLimit: 3})
	require.NoError(t, err)
	require.Equal(t, []pgx.TxIsoLevel{pgx.RepeatableRead}, r.iso, "one snapshot")
	require.Equal(t, "diamond", d.Name)
	require.Equal(t, "in_progress", d.Status)
	require.JSONEq(t, `{"k": 1}`, string(d.Context))
	require.Equal(t, int32(4), d.Steps)
	require.Len(t, d.StepList, 4)
	byName := map[string]readmodel.Step{}
	for _, s := range d.StepList {
		byName[s.Name] = s
	}
	require.Equal(t, "complete", byName["a"].State)
	require.False(t, byName["a"].Ready)
	require.Equal(t, []string{"b", "c"}, byName["d"].Parents)
	require.Equal(t, "waiting_for_dependencies", *byName["d"].BlockedReason)
	require.Contains(t, byName["d"].Why, "waiting for")
	var failed, ready readmodel.Step
	for _, n := range []string{"b", "c"} {
		if byName[n].State == "waiting_for_retry" {
			failed = byName[n]
		} else {
			ready = byName[n]
		}
	}
	require.Equal(t, "backoff", *failed.BlockedReason)
	require.JSONEq(t, `"boom"`, string(mustField(t, failed.LastError, "message")))
	require.True(t, ready.Ready)
	require.Empty(t, ready.Why)
	require.ElementsMatch(t, []readmodel.Edge{{ids["a"], ids["b"]}, {ids["a"], ids["c"]}, {ids["b"], ids["d"]},
		{ids["c"], ids["d"]}}, d.Edges)
	require.Len(t, d.Attempts, 2)
	require.Equal(t, "attempt.succeeded", d.Attempts[0].Outcome)
	require.Equal(t, "attempt.failed", d.Attempts[1].Outcome)
	require.Len(t, d.Events, 3)
	require.True(t, d.MoreEvents)
	require.Greater(t, d.Events[0].ID, d.Events[1].ID, "newest first")
	older, more, err := readmodel.Events(t.Context(), r, taskID, 0, d.Events[2].ID, 100)
	require.NoError(t, err)
	require.False(t, more)
	all, err := readmodel.Timeline(t.Context(), r, taskID)
	require.NoError(t, err)
	require.Len(t, all, len(older)+3)

	_, err = readmodel.ReadTask(t.Context(), r, taskID+1000, readmodel.TaskOptions{})
	require.ErrorIs(t, err, readmodel.ErrNotFound)
	require.ErrorContains(t, err, "does not exist")
}

func mustField(t *testing.T, doc []byte, field string) []byte {
	t.Helper()
	var m map[string]jsonRaw
	require.NoError(t, jsonUnmarshal(doc, &m))
	return m[field]
}

// ReadStep, Explain, StepID and StepTask agree with ReadTask; a step of another task is not found.
func TestReadStepAndExplain(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := &recorder{db: db, texts: map[string]bool{}}
	taskID, ids := diamond(t, db)
	ctx := t.Context()
	at := time.Now().Add(2 * time.Hour)

	s, err := readmodel.ReadStep(ctx, r, taskID, ids["d"], &at)
	require.NoError(t, err)
	require.Equal(t, "d", s.Name)
	require.Equal(t, at, s.AsOf)
	require.NotEmpty(t, s.Reasons)
	require.Equal(t, "waiting_for_dependencies", s.Reasons[0].Reason)
	require.JSONEq(t, `{}`, string(s.Input))
	s, err = readmodel.ReadStep(ctx, r, taskID, ids["a"], nil)
	require.NoError(t, err)
	require.JSONEq(t, `{"out": 1}`, string(s.Output))
	require.Len(t, s.Attempts, 1)
	require.NotEmpty(t, s.Events)
	_, err = readmodel.ReadStep(ctx, r, taskID+1, ids["a"], nil)
	require.ErrorIs(t, err, readmodel.ErrNotFound)

	x, err := readmodel.Explain(ctx, r, taskID, 0, nil)
	require.NoError(t, err)
	require.Len(t, x.Steps, 4)
	x, err = readmodel.Explain(ctx, r, taskID, ids["d"], nil)
	require.NoError(t, err)
	require.Len(t, x.Steps, 1)
	require.Equal(t, "waiting_for_dependencies", x.Steps[0].Reasons[0].Reason)

	id, err := readmodel.StepID(ctx, r, taskID, "c")
	require.NoError(t, err)
	require.Equal(t, ids["c"], id)
	_, err = readmodel.StepID(ctx, r, taskID, "nope")
	require.ErrorIs(t, err, readmodel.ErrNotFound)
	task, err := readmodel.StepTask(ctx, r, ids["c"])
	require.NoError(t, err)
	require.Equal(t, taskID, task)
	_, err = readmodel.StepTask(ctx, r, 0)
	require.ErrorIs(t, err, readmodel.ErrNotFound)
}

// ListTasks pages newest first by keyset; CountTasks counts exactly under the threshold and estimates above.
func TestListAndCountTasks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	for i := range 5 {
		exec(t, db, `SELECT stepready.create_task(jsonb_build_object('name', $1::text, 'steps',
			'[{"name": "s", "handler": "noop"}]'::jsonb))`, []string{"x", "y"}[i%2])
	}
	exec(t, db, `SELECT stepready.cancel_task(max(id)) FROM stepready.tasks`)
	page, err := readmodel.ListTasks(ctx, db.Pool, readmodel.TaskFilter{Limit: 2})
	require.NoError(t, err)
	require.Len(t, page, 2)
	require.Equal(t, "cancelled", page[0].Status)
	next, err := readmodel.ListTasks(ctx, db.Pool, readmodel.TaskFilter{Limit: 10, Before: page[1].ID})
	require.NoError(t, err)
	require.Len(t, next, 3)
	xs, err := readmodel.ListTasks(ctx, db.Pool, readmodel.TaskFilter{Limit: 10, Name: "x", Status: "pending"})
	require.NoError(t, err)
	require.Len(t, xs, 2)
	exec(t, db, `SELECT stepready.pause_task($1)`, xs[0].ID)
	paused, err := readmodel.ListTasks(ctx, db.Pool, readmodel.TaskFilter{Limit: 10, Status: "paused"})
	require.NoError(t, err)
	require.Len(t, paused, 1, "paused is a filter of its own")
	require.Equal(t, xs[0].ID, paused[0].ID)
	_, err = readmodel.ListTasks(ctx, db.Pool, readmodel.TaskFilter{})
	require.ErrorContains(t, err, "limit 0")

	c, err := readmodel.CountTasks(ctx, db.Pool, 1000)
	require.NoError(t, err)
	require.False(t, c.Estimated)
	require.Equal(t, []readmodel.StatusCount{{"cancelled", 1}, {"pending", 4}}, c.Counts)
	exec(t, db, `ANALYZE stepready.tasks`)
	c, err = readmodel.CountTasks(ctx, db.Pool, 1)
	require.NoError(t, err)
	require.True(t, c.Estimated)
}

// Policies, Simulate and Templates read what the tables hold; a simulation follows fail_step's rules.
func TestPoliciesSimulateTemplates(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	ps, err := readmodel.Policies(ctx, db.Pool)
	require.NoError(t, err)
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	require.Subset(t, names, []string{"aggressive", "none", "patient", "standard"})

	sim, err := readmodel.Simulate(ctx, db.Pool, "standard", readmodel.SimulateOptions{MaxAttempts: 100})
	require.NoError(t, err)
	require.False(t, sim.Overridden)
	require.Len(t, sim.Timeline, 3)
	require.Equal(t, int64(1000), *sim.Timeline[0].DelayMs)
	require.Equal(t, int64(3000), sim.Timeline[2].StartsAtMs)
	require.False(t, sim.Timeline[2].Retry)
	five := int32(5)
	sim, err = readmodel.Simulate(ctx, db.Pool, "standard", readmodel.SimulateOptions{MaxAttempts: 100,
		Overrides: readmodel.PolicyOverrides{MaxAttempts: &five, Uncapped: true}})
	require.NoError(t, err)
	require.True(t, sim.Overridden)
	require.Len(t, sim.Timeline, 5)
	require.Nil(t, sim.Policy.MaxDelayMs)
	_, err = readmodel.Simulate(ctx, db.Pool, "nope", readmodel.SimulateOptions{MaxAttempts: 1})
	require.ErrorIs(t, err, readmodel.ErrNotFound)
	seed := 0.5
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		jitter := 0.5
		s, err := readmodel.Simulate(ctx, tx, "standard", readmodel.SimulateOptions{MaxAttempts: 10, Seed: &seed,
			Overrides: readmodel.PolicyOverrides{Jitter: &jitter}})
		require.NotNil(t, s.Timeline[0].JitterSample)
		return err
	})
	require.NoError(t, err)

	exec(t, db, `INSERT INTO stepready.task_templates (name, version, definition) VALUES
		('t', 1, '{"steps": [{"name": "a", "handler": "noop"}]}'),
		('t', 2, '{"steps": [{"name": "a", "handler": "noop"}, {"name": "b", "handler": "noop"}]}')`)
	ts, err := readmodel.Templates(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, ts, 2)
	require.False(t, ts[0].Newest)
	require.True(t, ts[1].Newest)
	require.Equal(t, int32(2), ts[1].Steps)
}

// The cursor misses no event whose transaction commits after a later one's, and gives up on an id whose
// transaction rolled back once GapWait has passed.
func TestEventCursorSeesALateCommit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	var taskID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "t",
		"steps": [{"name": "s", "handler": "noop"}]}')`).Scan(&taskID))
	c, err := readmodel.NewEventCursor(ctx, db.Pool)
	require.NoError(t, err)
	insert := `INSERT INTO stepready.step_events (task_id, event, details) VALUES ($1, 'operator.test', '{}') RETURNING id`

	late, err := db.Pool.Begin(ctx) // takes the lower id, commits last
	require.NoError(t, err)
	var lateID, earlyID int64
	require.NoError(t, late.QueryRow(ctx, insert, taskID).Scan(&lateID))
	require.NoError(t, db.Pool.QueryRow(ctx, insert, taskID).Scan(&earlyID))
	require.Greater(t, earlyID, lateID)

	now := time.Now()
	ids := func(events []readmodel.Event) []int64 {
		out := []int64{}
		for _, e := range events {
			require.Equal(t, taskID, e.TaskID)
			require.Equal(t, "t", e.TaskName)
			out = append(out, e.ID)
		}
		return out
	}
	got, err := c.Poll(ctx, db.Pool, 100, now)
	require.NoError(t, err)
	require.Equal(t, []int64{earlyID}, ids(got))
	require.NoError(t, late.Commit(ctx))
	got, err = c.Poll(ctx, db.Pool, 100, now.Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, []int64{lateID}, ids(got), "the late commit is still seen")
	got, err = c.Poll(ctx, db.Pool, 100, now.Add(2*time.Second))
	require.NoError(t, err)
	require.Empty(t, got, "nothing twice")

	// A rolled-back id below a seen one is waited for, then given up on: later events keep coming.
	gone, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	var goneID, afterID int64
	require.NoError(t, gone.QueryRow(ctx, insert, taskID).Scan(&goneID))
	require.NoError(t, gone.Rollback(ctx))
	require.NoError(t, db.Pool.QueryRow(ctx, insert, taskID).Scan(&afterID))
	got, err = c.Poll(ctx, db.Pool, 100, now.Add(3*time.Second))
	require.NoError(t, err)
	require.Equal(t, []int64{afterID}, ids(got))
	_, err = c.Poll(ctx, db.Pool, 100, now.Add(3*time.Second+readmodel.DefaultGapWait))
	require.NoError(t, err)
	var nextID int64
	require.NoError(t, db.Pool.QueryRow(ctx, insert, taskID).Scan(&nextID))
	got, err = c.Poll(ctx, db.Pool, 100, now.Add(4*time.Second+readmodel.DefaultGapWait))
	require.NoError(t, err)
	require.Equal(t, []int64{nextID}, ids(got))
}

// Every query of queries.sql is run by some read of this package's tests: a renamed column fails here.
func TestEveryQueryRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := &recorder{db: db, texts: map[string]bool{}}
	ctx := t.Context()
	taskID, ids := diamond(t, db)
	exec(t, db, `INSERT INTO stepready.task_templates (name, version, definition) VALUES ('t', 1, '{"steps": [{"name": "a", "handler": "noop"}]}')`)
	_, err := readmodel.ReadTask(ctx, r, taskID, readmodel.TaskOptions{Attempts: true, Events: true, EventsLimit: 5})
	require.NoError(t, err)
	_, err = readmodel.ReadStep(ctx, r, taskID, ids["a"], nil)
	require.NoError(t, err)
	_, err = readmodel.Explain(ctx, r, taskID, 0, nil)
	require.NoError(t, err)
	mapTaskID, mapID := mapTask(t, db, 3)
	_, err = readmodel.ReadStep(ctx, r, mapTaskID, mapID, nil) // its elements
	require.NoError(t, err)
	_, err = readmodel.StepID(ctx, r, taskID, "a")
	require.NoError(t, err)
	_, err = readmodel.StepTask(ctx, r, ids["a"])
	require.NoError(t, err)
	_, err = readmodel.ListTasks(ctx, r, readmodel.TaskFilter{Limit: 5})
	require.NoError(t, err)
	exec(t, db, `ANALYZE stepready.tasks`)
	for _, threshold := range []int64{1_000_000, 0} {
		_, err = readmodel.CountTasks(ctx, r, threshold)
		require.NoError(t, err)
	}
	_, err = readmodel.TaskTimeline(ctx, r, taskID)
	require.NoError(t, err)
	_, err = readmodel.Policies(ctx, r)
	require.NoError(t, err)
	seed := 0.1
	_, err = readmodel.Simulate(ctx, r, "standard", readmodel.SimulateOptions{MaxAttempts: 5, Seed: &seed})
	require.NoError(t, err)
	_, err = readmodel.Templates(ctx, r)
	require.NoError(t, err)
	for name, want := range map[string]bool{"t": true, "nope": false} {
		got, err := readmodel.TemplateExists(ctx, r, name)
		require.NoError(t, err)
		require.Equal(t, want, got, name)
	}
	created, err := readmodel.ReadCreatedTask(ctx, r, taskID)
	require.NoError(t, err)
	require.Equal(t, readmodel.CreatedTask{Steps: int32(len(ids))}, created)
	_, err = readmodel.ReadCreatedTask(ctx, r, -1)
	require.ErrorIs(t, err, readmodel.ErrNotFound)
	c, err := readmodel.NewEventCursor(ctx, r)
	require.NoError(t, err)
	_, err = c.Poll(ctx, r, 10, time.Now())
	require.NoError(t, err)
	var waitTask, signalID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "w",
		"steps": [{"name": "w", "wait": {"signal": "go"}}]}')`).Scan(&waitTask))
	waiting, err := readmodel.WaitingForSignal(ctx, r, []int64{waitTask, taskID})
	require.NoError(t, err)
	require.Len(t, waiting, 1)
	require.Equal(t, readmodel.WaitingStep{TaskID: waitTask, StepID: waiting[0].StepID, Name: "w", Signal: "go"}, waiting[0])
	wait, err := readmodel.ReadStep(ctx, r, waitTask, waiting[0].StepID, nil)
	require.NoError(t, err)
	require.JSONEq(t, `{"signal": "go"}`, string(wait.Wait))
	require.Nil(t, wait.WaitUntil, "no timeout: no deadline")
	require.Empty(t, wait.Signals)
	require.NotNil(t, wait.Signals, "a wait step's mailbox, empty")
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.send_signal($1, 'go', '{"ok": true}')`, waitTask).
		Scan(&signalID))
	sigs, err := readmodel.Signals(ctx, r, waitTask)
	require.NoError(t, err)
	require.Len(t, sigs, 1)
	require.Equal(t, "w", *sigs[0].ConsumedByName)
	g, err := readmodel.ReadSignal(ctx, r, signalID)
	require.NoError(t, err)
	require.JSONEq(t, `{"ok": true}`, string(g.Payload))
	_, err = readmodel.Signals(ctx, r, -1)
	require.ErrorIs(t, err, readmodel.ErrNotFound)

	var missing []string
	for _, name := range readmodel.QueryNames() {
		if !r.texts[readmodel.QueryText(name)] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "queries no test ran")
}

type jsonRaw = json.RawMessage

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// Attempt numbers repeat after reset_task; the attempts of a step are its runs, each with its own outcome.
func TestAttemptsAreRunsNotNumbers(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	var taskID, stepID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "t",
		"steps": [{"name": "s", "handler": "noop", "retry": {"policy": "none"}}]}')`).Scan(&taskID))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT step_id FROM stepready.claim_and_start_steps(1, 'w', 60000)`).
		Scan(&stepID))
	exec(t, db, `SELECT * FROM stepready.fail_step($1, 1, '{"class": "permanent", "message": "first run"}')`, stepID)
	exec(t, db, `SELECT stepready.reset_task($1)`, taskID)
	exec(t, db, `SELECT count(*) FROM stepready.claim_and_start_steps(1, 'w', 60000)`)
	exec(t, db, `SELECT stepready.complete_step($1, 2, '{}')`, stepID)

	d, err := readmodel.ReadTask(ctx, db.Pool, taskID, readmodel.TaskOptions{Attempts: true})
	require.NoError(t, err)
	require.Len(t, d.Attempts, 2)
	require.Equal(t, int32(1), d.Attempts[0].Attempt)
	require.Equal(t, "attempt.failed", d.Attempts[0].Outcome)
	require.Equal(t, int32(1), d.Attempts[1].Attempt, "the number repeats after the reset")
	require.Equal(t, "attempt.succeeded", d.Attempts[1].Outcome)
}
