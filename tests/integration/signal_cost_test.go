package integration

// Issue 22 (SPEC §20), the cost of a signal and two defects of wait steps: the bookkeeping trigger ran twice per
// completion (once for the completed step, once more for its children's pending_parents), send_signal read the
// output cap twice when refusing and wrote a delivered signal twice; a wait step kept the default max_attempts
// (3) though it has one attempt; a wait step starting to wait sent a "ready" notification though it never
// becomes claimable.

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// callsOf runs do in a transaction of its own on conn, with function statistics on, commits it, and returns how
// many times it called each of the functions fns of schema stepready.
func callsOf(t *testing.T, conn *pgx.Conn, fns []string, do func(tx pgx.Tx) error) map[string]int64 {
	t.Helper()
	// Counts of earlier transactions stay pending in the backend until a flush: force one at the next idle.
	_, err := conn.Exec(t.Context(), `SELECT pg_catalog.pg_stat_force_next_flush()`)
	require.NoError(t, err)
	tx, err := conn.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(t.Context()) }()
	_, err = tx.Exec(t.Context(), `SET LOCAL track_functions = 'all'`)
	require.NoError(t, err)
	require.NoError(t, do(tx))
	got := map[string]int64{}
	for _, fn := range fns {
		var n int64
		require.NoError(t, tx.QueryRow(t.Context(), `SELECT COALESCE(sum(calls), 0)::bigint
			FROM pg_catalog.pg_stat_xact_user_functions WHERE schemaname = 'stepready' AND funcname = $1`, fn).
			Scan(&n))
		got[fn] = n
	}
	require.NoError(t, tx.Commit(t.Context()))
	return got
}

// TestSignalBookkeepingRunsOnce: a signal delivered to a waiting step, and a worker's completion, run the steps'
// bookkeeping trigger once: the pass for the completed step also counts down its children and wakes the daemons
// for those that became claimable, where the children's update fired a second pass of its own (each pass about
// 0.4 ms of a ~2 ms send). What the pass does is unchanged: the dependent is claimable with the payload, the task
// counted, the daemons told, the signal consumed, the events written. send_signal reads the output cap once,
// refusing or not, and delivers without _signal_deliver (the signal is written consumed; the step updated once).
// Before the change: _steps_after_update 2 calls for the send and 3 for the parent's complete_step (2 now: its
// own and approve's start of its wait), _max_output_bytes 2 when
// refusing, _signal_deliver 1.
func TestSignalBookkeepingRunsOnce(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	conn := b.db.Conn(t)
	fns := []string{"_steps_after_update", "_max_output_bytes", "_signal_deliver", "_notify_ready"}

	taskID, ids := b.approvalTask(`{"signal": "approval", "timeout_ms": 60000}`)
	attempt := b.run(ids["charge"], testBase)
	wakes := b.wakeCount()
	calls := callsOf(t, conn, fns, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.ctx, `SELECT stepready.complete_step($1, $2, '{}', $3)`, ids["charge"], attempt, testBase)
		return err
	})
	// Its pass, and the one for approve starting to wait (a statement of its own, with its own bookkeeping).
	require.Equal(t, int64(2), calls["_steps_after_update"], "complete_step: one bookkeeping pass and the wait's")
	b.requireState(ids["approve"], "waiting")
	require.Equal(t, wakes, b.wakeCount(), "approve is waiting, ship is not ready: nobody to wake")

	calls = callsOf(t, conn, fns, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.ctx, `SELECT stepready.send_signal($1, 'approval', '{"by": "ann"}', 'k1', $2)`, taskID,
			testBase.Add(time.Second))
		return err
	})
	require.Equal(t, map[string]int64{"_steps_after_update": 1, "_max_output_bytes": 1, "_signal_deliver": 0,
		"_notify_ready": 1}, calls, "send_signal delivering to a waiting step")
	// The one wake-up (the counter's increment) is ship's.
	require.Equal(t, wakes+1, b.wakeCount())

	s := b.step(ids["approve"])
	require.Equal(t, "complete", s.State)
	require.JSONEq(t, `{"by": "ann"}`, *s.Output)
	require.True(t, s.CompletedAt.Equal(testBase.Add(time.Second)))
	require.Equal(t, 0, b.step(ids["ship"]).PendingParents)
	sigs := b.signals(taskID)
	require.Len(t, sigs, 1)
	require.Equal(t, ids["approve"], *sigs[0].ConsumedBy)
	require.True(t, sigs[0].ConsumedAt.Equal(testBase.Add(time.Second)))
	require.Equal(t, []string{"wait.started", "signal.delivered", "step.completed"}, eventNames(b.events(ids["approve"])))
	var unsatisfied int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT steps_unsatisfied FROM stepready.tasks WHERE id = $1`,
		taskID).Scan(&unsatisfied))
	require.Equal(t, 1, unsatisfied, "ship only")
	rows := b.mapClaimStart(10, testBase.Add(time.Second))
	require.Len(t, rows, 1)
	require.Equal(t, ids["ship"], rows[0].StepID)
	require.JSONEq(t, `{"who": "ann"}`, rows[0].Input)
	b.requireStatus(taskID, "in_progress")

	// A worker's completion that readies a handler's step: one pass (before: 2), the child announced.
	_, chain := b.task(`{"name": "c", "steps": [{"name": "a", "handler": "h"},
		{"name": "b", "handler": "h", "depends_on": ["a"]}]}`)
	attempt = b.run(chain["a"], testBase)
	wakes = b.wakeCount()
	calls = callsOf(t, conn, fns, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.ctx, `SELECT stepready.complete_step($1, $2, '{}', $3)`, chain["a"], attempt, testBase)
		return err
	})
	require.Equal(t, int64(1), calls["_steps_after_update"], "complete_step readying a handler's step")
	require.Equal(t, int64(1), calls["_notify_ready"])
	require.Equal(t, wakes+1, b.wakeCount(), "the child announced")
	require.Equal(t, 0, b.step(chain["b"]).PendingParents)
	require.Equal(t, []int64{chain["b"]}, b.claimIDs(testBase)) // ship was started above

	// A payload over the cap: refused with one read of the cap.
	b.exec(`UPDATE stepready.settings SET value = '10' WHERE name = 'max_output_bytes'`)
	other, _ := b.approvalTask(`{"signal": "approval"}`)
	calls = callsOf(t, conn, fns, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.ctx, `SAVEPOINT s`)
		require.NoError(t, err)
		_, err = tx.Exec(b.ctx, `SELECT stepready.send_signal($1, 'approval', '{"by": "a long name"}')`, other)
		require.Equal(t, "54000", sqlState(err), "%v", err)
		require.ErrorContains(t, err, "over the limit of 10 bytes")
		_, err = tx.Exec(b.ctx, `ROLLBACK TO SAVEPOINT s`)
		return err
	})
	require.Equal(t, int64(1), calls["_max_output_bytes"], "the cap read once when refusing")
}

// TestWaitStepHasOneAttempt: a wait step is stored with max_attempts 1 and retryable false on every creation path
// (create_task, with a retry policy given or not; a template; a plain INSERT), whatever the retry settings of the
// step or the task: it has one attempt (the console showed "attempt 1/3"). Before: 3 and true (5 and true with the
// step's own retry).
func TestWaitStepHasOneAttempt(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	requireOne := func(stepID int64, how string) {
		t.Helper()
		s := b.step(stepID)
		require.Equal(t, 1, s.MaxAttempts, how)
		require.False(t, s.Retryable, how)
	}
	_, ids := b.task(`{"name": "t", "retry": {"max_attempts": 7}, "steps": [
		{"name": "w", "wait": {"signal": "go"}},
		{"name": "r", "wait": {"duration_ms": 1000}, "retry": {"max_attempts": 5, "retryable": true}},
		{"name": "p", "wait": {"signal": "go"}, "retry": {"policy": "standard"}},
		{"name": "h", "handler": "h", "depends_on": ["w"]}]}`)
	requireOne(ids["w"], "create_task")
	requireOne(ids["r"], "create_task, the step's retry")
	requireOne(ids["p"], "create_task, a policy")
	require.Equal(t, 7, b.step(ids["h"]).MaxAttempts, "a handler's step keeps its policy")
	require.Equal(t, 1, b.step(ids["w"]).Attempts)

	b.exec(`INSERT INTO stepready.task_templates (name, definition) VALUES ('one', $1::jsonb)`,
		`{"name": "one", "steps": [{"name": "w", "wait": {"signal": "go"}, "retry": {"max_attempts": 4}}]}`)
	var fromTemplate int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.create_task_from_template('one', '{}')`).
		Scan(&fromTemplate))
	requireOne(b.stepIDs(fromTemplate)["w"], "template")

	var taskID, plain int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`INSERT INTO stepready.tasks (name, retry) VALUES ('plain', '{"max_attempts": 6}') RETURNING id`).
		Scan(&taskID))
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, wait, max_attempts)
		VALUES ($1, 'w', '{"signal": "go"}', 9) RETURNING id`, taskID).Scan(&plain))
	requireOne(plain, "plain INSERT")
	b.requireState(plain, "waiting")
}

// TestWaitStepStartingToWaitNotifiesNothing: a wait step that starts waiting, when its last parent completes, when
// its task is created, when it is inserted by hand or reset, sends no "ready" notification (it passes through
// `pending` with no parent left inside the transaction, but no claim can take it); a real step made ready in the
// same transaction still wakes the daemons, and so does the dependent a signal readies. Before: one spurious
// notification of the task from the completion, the plain INSERT and the reset.
func TestWaitStepStartingToWaitNotifiesNothing(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	l := b.listen() // and no writing transaction notifies (sql/045_notify.sql): only the counter moves
	wakes := b.wakeCount()
	moved := func(want int64, what string) {
		t.Helper()
		now := b.wakeCount()
		require.Equal(t, want, now-wakes, what)
		wakes = now
	}

	// The last parent completes: the wait step starts waiting, nothing is ready.
	taskID, ids := b.approvalTask(`{"signal": "approval", "timeout_ms": 1000}`)
	attempt := b.run(ids["charge"], pastTime)
	wakes = b.wakeCount()
	require.True(t, b.complete(ids["charge"], attempt, `{}`, pastTime))
	b.requireState(ids["approve"], "waiting")
	moved(0, "the last parent completed")

	// The signal readies ship: that is announced, once.
	b.mustSend(taskID, "approval", `{"by": "ann"}`, pastTime)
	moved(1, "the signal readied ship")

	// A wait beside a real step: the real one is announced.
	both, ids2 := b.task(`{"name": "both", "steps": [{"name": "a", "handler": "h"},
		{"name": "w", "wait": {"signal": "go"}, "depends_on": ["a"]},
		{"name": "x", "handler": "h", "depends_on": ["a"]}]}`)
	attempt = b.run(ids2["a"], pastTime)
	wakes = b.wakeCount()
	require.True(t, b.complete(ids2["a"], attempt, `{}`, pastTime))
	b.requireState(ids2["w"], "waiting")
	require.NotEmpty(t, both)
	moved(1, "x became ready beside the wait")

	// A plain INSERT of a wait step without parents: it starts waiting at commit, unannounced.
	var plainTask, plain int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `INSERT INTO stepready.tasks (name) VALUES ('plain') RETURNING id`).
		Scan(&plainTask))
	wakes = b.wakeCount()
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, wait)
		VALUES ($1, 'w', '{"signal": "go"}') RETURNING id`, plainTask).Scan(&plain))
	b.requireState(plain, "waiting")
	moved(0, "a plain INSERT of a wait step")

	// A reset of a wait step that timed out: it waits afresh, unannounced.
	tw, w := b.waitTask(`{"signal": "s", "timeout_ms": 0}`, "")
	b.claim(10, testBase) // the claim's prologue ends the due wait: it fails, the task is in error
	b.requireState(w, "error")
	wakes = b.wakeCount()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.reset_task($1, $2)`, tw, testBase).Scan(&n))
	require.Equal(t, 1, n)
	b.requireState(w, "waiting")
	moved(0, "a reset wait step")
	l.requireNone()
}
