package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// requireOperatorEvent requires the newest event of the task with this name to exist and be stamped at asOf.
func (b *lifecycleBundle) requireOperatorEvent(taskID int64, stepID *int64, name string, asOf time.Time) lifecycleEvent {
	b.t.Helper()
	var evs []lifecycleEvent
	if stepID != nil {
		evs = b.events(*stepID)
	} else {
		evs = b.taskEvents(taskID)
	}
	named := eventsNamed(evs, name)
	require.NotEmpty(b.t, named, "no %s event (task %d, step %v): %v", name, taskID, deref(stepID),
		eventNames(evs))
	ev := named[len(named)-1]
	require.True(b.t, asOf.Equal(ev.At), "%s stamped %s, want %s", name, ev.At, asOf)
	return ev
}

func TestCancelTask(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskID, ids := b.task(`{"name": "t", "steps": [
		{"name": "done", "handler": "h"}, {"name": "running", "handler": "h"}, {"name": "idle", "handler": "h"},
		{"name": "waiting", "handler": "h"}, {"name": "child", "handler": "h", "depends_on": ["done"]},
		{"name": "claimed", "handler": "h"}]}`)
	b.runToComplete(ids["done"], `{"kept": true}`, at)
	running := b.run(ids["running"], at)
	b.retryOnce(ids["waiting"], `{}`, at)
	b.enqueue(ids["claimed"], at)

	cancelAt := at.Add(time.Minute)
	require.Equal(t, 5, b.intCall(`SELECT stepready.cancel_task($1, 'operator said so', $2)`, taskID, cancelAt))
	b.requireStatus(taskID, "cancelled")
	for _, name := range []string{"running", "idle", "waiting", "child", "claimed"} {
		s := b.step(ids[name])
		require.Equal(t, "cancelled", s.State, name)
		if name == "running" {
			// Its handler may still run: the lease stays, orphaned, until the worker reports or it expires.
			require.Equal(t, testWorker, deref(s.LeaseOwner), name)
			require.NotNil(t, s.LeaseExpiresAt, name)
		} else {
			require.Nil(t, s.LeaseOwner, name)
			require.Nil(t, s.LeaseExpiresAt, name)
		}
		ev := b.lastEvents(ids[name], 1)[0]
		require.Equal(t, "step.cancelled", ev.Event, name)
		require.Equal(t, "operator said so", ev.Details["reason"], name)
	}
	done := b.step(ids["done"])
	require.Equal(t, "complete", done.State)
	require.JSONEq(t, `{"kept": true}`, deref(done.Output))
	ev := b.requireOperatorEvent(taskID, nil, "operator.cancel", cancelAt)
	require.Equal(t, "operator said so", ev.Details["reason"])

	// The in-flight attempt is fenced out; nothing of the task runs any more. Its worker's first report ends
	// its orphaned lease and changes nothing else.
	before := b.taskSnapshotBeyondLeases(taskID)
	require.False(t, b.complete(ids["running"], running, `{}`, cancelAt))
	require.Equal(t, before, b.taskSnapshotBeyondLeases(taskID))
	require.Nil(t, b.step(ids["running"]).LeaseOwner)
	before = b.taskSnapshot(taskID)
	r := b.fail(ids["running"], running, `{}`, cancelAt, 0)
	require.Equal(t, "stale_attempt", deref(r.Reason))
	require.False(t, b.boolCall(`SELECT stepready.heartbeat_step($1, $2, 1000, $3)`, ids["running"], running,
		cancelAt))
	require.Nil(t, b.start(ids["claimed"], cancelAt))
	require.Equal(t, before, b.taskSnapshot(taskID))
	require.Empty(t, b.claimIDs(cancelAt.Add(time.Hour)))
}

func TestCancelTaskInError(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.task(`{"name": "t", "steps": [{"name": "bad", "handler": "h"}, {"name": "idle", "handler": "h"}]}`)
	b.fail(ids["bad"], b.run(ids["bad"], testBase), `{"class": "permanent"}`, testBase, 0)
	b.requireStatus(taskID, "error")
	require.Equal(t, 1, b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, testBase))
	b.requireStatus(taskID, "cancelled")
	b.requireState(ids["bad"], "error")
	b.requireState(ids["idle"], "cancelled")
}

func TestCancelTaskRefusals(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, taskID, step int64)
	}{
		{"complete task", func(b *lifecycleBundle, _, step int64) { b.runToComplete(step, `{}`, testBase) }},
		{"already cancelled", func(b *lifecycleBundle, taskID, _ int64) {
			b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, testBase)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			tc.setup(b, taskID, step)
			before := b.taskSnapshot(taskID)
			err := b.callErr(`SELECT stepready.cancel_task($1, 'again', $2)`, taskID, testBase)
			requireSQLState(t, err, "55000", fmt.Sprintf("task %d", taskID))
			require.Equal(t, before, b.taskSnapshot(taskID))
		})
	}
}

func TestPauseAndResumeTask(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskID, ids := b.task(`{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"},
		{"name": "c", "handler": "h", "depends_on": ["a"]}]}`)
	otherTask, other := b.oneStep("")

	require.True(t, b.boolCall(`SELECT stepready.pause_task($1, $2)`, taskID, at))
	require.True(t, b.taskRow(taskID).Paused)
	b.requireOperatorEvent(taskID, nil, "operator.pause", at)
	require.False(t, b.boolCall(`SELECT stepready.pause_task($1, $2)`, taskID, at), "already paused")
	require.Len(t, eventsNamed(b.taskEvents(taskID), "operator.pause"), 1, "a no-op pause is not audited")

	require.Equal(t, []int64{other}, b.claimIDs(at), "only the other task's step is claimed")
	b.requireNotReady(ids["a"], at, "task_paused")
	b.requireStatus(otherTask, "in_progress")

	resumeAt := at.Add(time.Minute)
	require.True(t, b.boolCall(`SELECT stepready.resume_task($1, $2)`, taskID, resumeAt))
	require.False(t, b.taskRow(taskID).Paused)
	b.requireOperatorEvent(taskID, nil, "operator.resume", resumeAt)
	require.False(t, b.boolCall(`SELECT stepready.resume_task($1, $2)`, taskID, resumeAt), "not paused")
	require.Len(t, eventsNamed(b.taskEvents(taskID), "operator.resume"), 1)

	require.ElementsMatch(t, []int64{ids["a"], ids["b"]}, b.claimIDs(resumeAt))

	// Pausing an in_progress task stops its next steps too, and a child readied while paused waits.
	attempt := deref(b.start(ids["a"], resumeAt))
	require.True(t, b.boolCall(`SELECT stepready.pause_task($1, $2)`, taskID, resumeAt))
	require.True(t, b.complete(ids["a"], attempt, `{}`, resumeAt), "an in-flight attempt may finish")
	require.Empty(t, b.claimIDs(resumeAt))
	require.True(t, b.boolCall(`SELECT stepready.resume_task($1, $2)`, taskID, resumeAt))
	require.Equal(t, []int64{ids["c"]}, b.claimIDs(resumeAt))
}

func TestPauseTaskRefusals(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, taskID, step int64)
	}{
		{"complete task", func(b *lifecycleBundle, _, step int64) { b.runToComplete(step, `{}`, testBase) }},
		{"cancelled task", func(b *lifecycleBundle, taskID, _ int64) {
			b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, testBase)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			tc.setup(b, taskID, step)
			before := b.taskSnapshot(taskID)
			err := b.callErr(`SELECT stepready.pause_task($1, $2)`, taskID, testBase)
			requireSQLState(t, err, "55000", fmt.Sprintf("task %d", taskID))
			require.Equal(t, before, b.taskSnapshot(taskID))
		})
	}
}

func TestRetryStepNowClearsTheBackoff(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name      string
		setup     func(b *lifecycleBundle, step int64)
		wantState string
	}{
		{"waiting_for_retry", func(b *lifecycleBundle, step int64) {
			b.retryOnce(step, `{"retry_after_ms": 3600000}`, testBase)
		}, "waiting_for_retry"},
		{"pending with a delayed first attempt", func(b *lifecycleBundle, step int64) {
			b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, step, testBase.Add(time.Hour))
		}, "pending"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			tc.setup(b, step)
			require.Empty(t, b.claimIDs(testBase), "not due yet")
			attemptsBefore := b.step(step).Attempts

			require.True(t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, step, testBase))
			s := b.step(step)
			require.Equal(t, tc.wantState, s.State)
			require.Nil(t, s.NextAttemptAt)
			require.Equal(t, attemptsBefore, s.Attempts)
			b.requireOperatorEvent(taskID, &step, "operator.retry_now", testBase)
			require.Equal(t, []int64{step}, b.claimIDs(testBase), "claimable at as_of")
		})
	}
}

// TestRetryStepNowGrantsExactlyOneMoreAttempt: on a step in error, retry_step_now makes it claimable for one
// more attempt, whatever ended it; when that attempt fails too (even with a retryable class) the step ends in
// error again.
func TestRetryStepNowGrantsExactlyOneMoreAttempt(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name  string
		step  string
		fails []string // failures that put the step in error, the last one ends it
		why   string
	}{
		{"after retries_exhausted", `"retry": {"max_attempts": 2}`,
			[]string{`{}`, `{}`}, "retries_exhausted"},
		{"after a non-retryable class", `"retry": {"max_attempts": 3}`,
			[]string{`{"class": "permanent"}`}, "not_retryable"},
		{"after a non-retryable step", `"retry": {"max_attempts": 3, "retryable": false}`,
			[]string{`{}`}, "not_retryable"},
		{"after the circuit opened", `"retry": {"max_attempts": 10}`,
			[]string{`{"class": "contract_failure", "message": "x"}`, `{"class": "contract_failure", "message": "x"}`,
				`{"class": "contract_failure", "message": "x"}`}, "circuit_open"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep(tc.step)
			now := testBase
			for i, f := range tc.fails {
				if i < len(tc.fails)-1 {
					now = b.retryOnce(step, f, now)
					continue
				}
				r := b.fail(step, b.run(step, now), f, now, 0)
				require.Equal(t, tc.why, deref(r.Reason))
			}
			b.requireStatus(taskID, "error")
			attempts := len(tc.fails)

			now = now.Add(time.Minute)
			require.True(t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, step, now))
			s := b.step(step)
			require.Equal(t, "waiting_for_retry", s.State)
			require.Nil(t, s.NextAttemptAt)
			require.Equal(t, attempts, s.Attempts)
			b.requireStatus(taskID, "in_progress")
			ev := b.requireOperatorEvent(taskID, &step, "operator.retry_now", now)
			require.Equal(t, "error", deref(ev.FromState))

			require.Equal(t, []int64{step}, b.claimIDs(now), "one more attempt is granted")
			attempt := deref(b.start(step, now))
			require.Equal(t, attempts+1, attempt)
			r := b.fail(step, attempt, `{"class": "transient", "message": "still broken"}`, now, 0)
			require.Equal(t, "error", deref(r.State), "exactly one more attempt: reason %v", deref(r.Reason))
			b.requireStatus(taskID, "error")
			require.Empty(t, b.claimIDs(now.Add(time.Hour)))
		})
	}

	t.Run("the granted attempt may succeed", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, step := b.oneStep(`"retry": {"max_attempts": 1}`)
		b.fail(step, b.run(step, testBase), `{}`, testBase, 0)
		require.True(t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, step, testBase))
		require.True(t, b.complete(step, b.run(step, testBase), `{"ok": true}`, testBase))
		b.requireStatus(taskID, "complete")
	})
}

func TestRetryStepNowTaskLeavesErrorOnlyWhenNoStepIsInError(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.task(`{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"}]}`)
	require.ElementsMatch(t, []int64{ids["a"], ids["b"]}, b.claimIDs(testBase))
	attempts := map[string]int{}
	for _, name := range []string{"a", "b"} {
		attempts[name] = deref(b.start(ids[name], testBase))
		require.Equal(t, 1, attempts[name])
	}
	for _, name := range []string{"a", "b"} {
		require.Equal(t, "error", deref(b.fail(ids[name], attempts[name], `{"class": "permanent"}`, testBase, 0).State))
	}
	b.requireStatus(taskID, "error")

	require.True(t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, ids["a"], testBase))
	b.requireStatus(taskID, "error")
	require.Empty(t, b.claimIDs(testBase), "b is still in error: nothing starts")
	require.True(t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, ids["b"], testBase))
	b.requireStatus(taskID, "in_progress")
	require.ElementsMatch(t, []int64{ids["a"], ids["b"]}, b.claimIDs(testBase))
}

func TestRetryStepNowRefusals(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, taskID, step int64)
		in    string // text the message must contain besides the step id
	}{
		{"complete step", func(b *lifecycleBundle, _, step int64) { b.runToComplete(step, `{}`, testBase) }, "complete"},
		{"in_progress step", func(b *lifecycleBundle, _, step int64) { b.run(step, testBase) }, "in_progress"},
		{"enqueued step", func(b *lifecycleBundle, _, step int64) { b.enqueue(step, testBase) }, "enqueued"},
		{"cancelled task", func(b *lifecycleBundle, taskID, _ int64) {
			b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, testBase)
		}, "cancelled"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			tc.setup(b, taskID, step)
			before := b.taskSnapshot(taskID)
			err := b.callErr(`SELECT stepready.retry_step_now($1, $2)`, step, testBase)
			requireSQLState(t, err, "55000", fmt.Sprintf("step %d", step), tc.in)
			require.Equal(t, before, b.taskSnapshot(taskID))
		})
	}
}

func TestResolveStep(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskID, ids := b.task(`{"name": "t", "steps": [{"name": "a", "handler": "h"},
		{"name": "dep", "handler": "h", "depends_on": ["a"]}]}`)
	b.fail(ids["a"], b.run(ids["a"], at), `{"class": "permanent"}`, at, 0)
	b.requireStatus(taskID, "error")

	resolveAt := at.Add(time.Minute)
	require.True(t, b.boolCall(`SELECT stepready.resolve_step($1, '{"manual": true}'::jsonb, $2)`, ids["a"],
		resolveAt))
	a := b.step(ids["a"])
	require.Equal(t, "resolved_manually", a.State)
	require.JSONEq(t, `{"manual": true}`, deref(a.Output))
	b.requireStatus(taskID, "in_progress")
	ev := b.requireOperatorEvent(taskID, ptr(ids["a"]), "operator.resolve", resolveAt)
	require.Equal(t, "error", deref(ev.FromState))
	b.requireOperatorEvent(taskID, ptr(ids["a"]), "step.resolved", resolveAt)

	require.Equal(t, []int64{ids["dep"]}, b.claimIDs(resolveAt), "dependents proceed")
	require.True(t, b.complete(ids["dep"], deref(b.start(ids["dep"], resolveAt)), `{}`, resolveAt))
	b.requireStatus(taskID, "complete")
}

func TestResolveStepFencesTheRunningAttempt(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, step := b.oneStep("")
	attempt := b.run(step, testBase)
	require.True(t, b.boolCall(`SELECT stepready.resolve_step($1, '{"by": "hand"}'::jsonb, $2)`, step, testBase))
	b.requireStatus(taskID, "complete")
	require.NotNil(t, b.step(step).LeaseExpiresAt, "the running attempt keeps its lease, orphaned")
	before := b.taskSnapshotBeyondLeases(taskID)

	require.False(t, b.complete(step, attempt, `{"by": "worker"}`, testBase))
	require.Nil(t, b.step(step).LeaseExpiresAt, "the worker's report ends the orphaned lease")
	r := b.fail(step, attempt, `{}`, testBase, 0)
	require.Equal(t, "stale_attempt", deref(r.Reason))
	require.Equal(t, "resolved_manually", deref(r.State))
	require.Equal(t, before, b.taskSnapshotBeyondLeases(taskID), "the stale worker result changes nothing else")
	require.JSONEq(t, `{"by": "hand"}`, deref(b.step(step).Output))
}

func TestResolveStepRefusals(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, taskID, step int64)
		in    string
	}{
		{"complete step", func(b *lifecycleBundle, _, step int64) { b.runToComplete(step, `{}`, testBase) }, "complete"},
		{"resolved_manually step", func(b *lifecycleBundle, _, step int64) {
			require.True(b.t, b.boolCall(`SELECT stepready.resolve_step($1, '{}'::jsonb, $2)`, step, testBase))
		}, "resolved_manually"},
		{"cancelled task", func(b *lifecycleBundle, taskID, _ int64) {
			b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, testBase)
		}, "cancelled"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			tc.setup(b, taskID, step)
			before := b.taskSnapshot(taskID)
			err := b.callErr(`SELECT stepready.resolve_step($1, '{"x": 1}'::jsonb, $2)`, step, testBase)
			requireSQLState(t, err, "55000", fmt.Sprintf("step %d", step), tc.in)
			require.Equal(t, before, b.taskSnapshot(taskID))
		})
	}
}

func TestResetTask(t *testing.T) {
	t.Parallel()

	t.Run("error step", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.task(`{"name": "t", "steps": [{"name": "done", "handler": "h"},
			{"name": "bad", "handler": "h", "retry": {"max_attempts": 10, "backoff": "fixed", "base_delay_ms": 0}},
			{"name": "child", "handler": "h", "depends_on": ["done", "bad"]}]}`)
		b.runToComplete(ids["done"], `{"kept": 1}`, testBase)
		cf := `{"class": "contract_failure", "message": "schema"}`
		b.retryOnce(ids["bad"], cf, testBase)
		b.retryOnce(ids["bad"], cf, testBase)
		r := b.fail(ids["bad"], b.run(ids["bad"], testBase), cf, testBase, 0)
		require.Equal(t, "circuit_open", deref(r.Reason))
		b.requireStatus(taskID, "error")

		resetAt := testBase.Add(time.Minute)
		require.Equal(t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, resetAt))
		bad := b.step(ids["bad"])
		require.Equal(t, "pending", bad.State)
		require.Equal(t, 0, bad.Attempts)
		require.Equal(t, 0, bad.BreakerCount, "the breaker streak is cleared")
		require.Nil(t, bad.NextAttemptAt)
		done := b.step(ids["done"])
		require.Equal(t, "complete", done.State)
		require.JSONEq(t, `{"kept": 1}`, deref(done.Output), "completed outputs are kept")
		b.requireStatus(taskID, "in_progress")
		b.requireOperatorEvent(taskID, nil, "operator.reset", resetAt)
		b.requireOperatorEvent(taskID, ptr(ids["bad"]), "operator.reset", resetAt)

		// A fresh budget: the same failure twice more does not open the circuit.
		require.Equal(t, []int64{ids["bad"]}, b.claimIDs(resetAt))
		b.exec(`UPDATE stepready.steps SET state = 'pending' WHERE id = $1`, ids["bad"]) // unclaim
		b.retryOnce(ids["bad"], cf, resetAt)
		b.retryOnce(ids["bad"], cf, resetAt)
		b.runToComplete(ids["bad"], `{}`, resetAt)
		b.runToComplete(ids["child"], `{}`, resetAt)
		b.requireStatus(taskID, "complete")
	})

	t.Run("skipped steps of a complete task", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.task(`{"name": "t", "steps": [
			{"name": "a", "handler": "h", "on_exhausted": "skip_cascade", "retry": {"max_attempts": 1}},
			{"name": "b", "handler": "h", "depends_on": ["a"]}]}`)
		b.fail(ids["a"], b.run(ids["a"], testBase), `{}`, testBase, 0)
		b.requireState(ids["b"], "skipped")
		b.requireStatus(taskID, "complete")

		require.Equal(t, 2, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, testBase))
		b.requireStatus(taskID, "in_progress")
		b.requireState(ids["a"], "pending")
		b.requireState(ids["b"], "pending")
		require.Equal(t, 1, b.step(ids["b"]).PendingParents)
		require.Equal(t, []int64{ids["a"]}, b.claimIDs(testBase))
	})

	t.Run("cancelled task", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.task(`{"name": "t", "steps": [{"name": "done", "handler": "h"},
			{"name": "idle", "handler": "h"}, {"name": "running", "handler": "h"}]}`)
		b.runToComplete(ids["done"], `{}`, testBase)
		running := b.run(ids["running"], testBase)
		require.Equal(t, 2, b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, testBase))

		require.Equal(t, 2, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, testBase))
		b.requireStatus(taskID, "in_progress")
		require.Equal(t, 0, b.step(ids["running"]).Attempts)
		require.False(t, b.complete(ids["running"], running, `{}`, testBase), "the cancelled attempt stays fenced")
		require.ElementsMatch(t, []int64{ids["idle"], ids["running"]}, b.claimIDs(testBase))
		b.requireState(ids["done"], "complete")
	})

	t.Run("nothing to reset", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, step := b.oneStep("")
		b.retryOnce(step, `{}`, testBase)
		before := b.taskSnapshot(taskID)
		err := b.callErr(`SELECT stepready.reset_task($1, $2)`, taskID, testBase)
		requireSQLState(t, err, "55000", fmt.Sprintf("task %d", taskID))
		require.Equal(t, before, b.taskSnapshot(taskID))
	})
}

func TestOperatorsRejectUnknownIDs(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name, sql, what string
	}{
		{"cancel_task", `SELECT stepready.cancel_task(424242, NULL, $1)`, "task 424242"},
		{"pause_task", `SELECT stepready.pause_task(424242, $1)`, "task 424242"},
		{"resume_task", `SELECT stepready.resume_task(424242, $1)`, "task 424242"},
		{"reset_task", `SELECT stepready.reset_task(424242, $1)`, "task 424242"},
		{"retry_step_now", `SELECT stepready.retry_step_now(424242, $1)`, "step 424242"},
		{"resolve_step", `SELECT stepready.resolve_step(424242, '{}'::jsonb, $1)`, "step 424242"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			requireSQLState(t, b.callErr(tc.sql, testBase), "P0002", tc.what)
			require.Equal(t, 0, b.intCall(`SELECT count(*) FROM stepready.step_events`))
		})
	}
}
