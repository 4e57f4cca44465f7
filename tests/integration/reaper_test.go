package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func (b *lifecycleBundle) reap(asOf time.Time, limit int) int {
	b.t.Helper()
	return b.intCall(`SELECT stepready.reap_expired_leases($1, $2)`, asOf, limit)
}

// TestReapExpiredLeasesBoundary: a lease expires when lease_expires_at < as_of, strictly.
func TestReapExpiredLeasesBoundary(t *testing.T) {
	t.Parallel()

	lease := testBase.Add(testLease) // the lease both fixtures below end up with
	cases := []struct {
		name   string
		asOf   time.Time
		reaped bool
	}{
		{"lease ended 1us before as_of", lease.Add(tick), true},
		{"lease ends at as_of", lease, false},
		{"lease ends 1us after as_of", lease.Add(-tick), false},
	}
	for _, state := range []string{"enqueued", "in_progress"} {
		for _, tc := range cases {
			t.Run(state+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b := lifecycleSetup(t)
				_, step := b.oneStep("")
				if state == "enqueued" {
					b.enqueue(step, testBase)
				} else {
					b.run(step, testBase)
				}
				requireTime(t, lease, b.step(step).LeaseExpiresAt, "lease_expires_at")
				before := b.snapshot(step)

				n := b.reap(tc.asOf, 1000)
				if !tc.reaped {
					require.Equal(t, 0, n)
					require.Equal(t, before, b.snapshot(step), "a live lease is not touched")
					return
				}
				require.Equal(t, 1, n)
				require.NotEqual(t, state, b.step(step).State)
			})
		}
	}
}

func TestReapExpiredLeasesEnqueuedReturnsUncharged(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name          string
		priorFailures int
		wantState     string
	}{
		{"never attempted", 0, "pending"},
		{"after a failure", 1, "waiting_for_retry"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			_, step := b.oneStep("")
			now := testBase
			for range tc.priorFailures {
				now = b.retryOnce(step, `{}`, now)
			}
			nextBefore := b.step(step).NextAttemptAt
			b.enqueue(step, now)

			reapAt := now.Add(testLease + tick)
			require.Equal(t, 1, b.reap(reapAt, 1000))
			s := b.step(step)
			require.Equal(t, tc.wantState, s.State)
			require.Equal(t, tc.priorFailures, s.Attempts, "uncharged")
			requireSameTime(t, nextBefore, s.NextAttemptAt, "next_attempt_at")
			require.Nil(t, s.LeaseOwner)
			require.Nil(t, s.LeaseExpiresAt)
			ev := b.lastEvents(step, 1)[0]
			require.Equal(t, "lease.expired", ev.Event)
			require.Equal(t, "enqueued", deref(ev.FromState))
			require.True(t, reapAt.Equal(ev.At))

			require.Equal(t, []int64{step}, b.claimIDs(reapAt), "ready again at once")
			require.Equal(t, tc.priorFailures+1, deref(b.start(step, reapAt)))
		})
	}
}

func TestReapExpiredLeasesInProgressFailsAsStalled(t *testing.T) {
	t.Parallel()

	t.Run("retry scheduled", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, step := b.oneStep(`"retry": {"max_attempts": 2}`)
		b.run(step, testBase)
		reapAt := testBase.Add(testLease + time.Second)
		require.Equal(t, 1, b.reap(reapAt, 1000))

		s := b.step(step)
		require.Equal(t, "waiting_for_retry", s.State)
		require.Equal(t, 1, s.Attempts, "a stalled attempt is charged")
		requireTime(t, reapAt.Add(time.Second), s.NextAttemptAt, "backoff of attempt 1")
		var lastError map[string]any
		require.NoError(t, json.Unmarshal([]byte(deref(s.LastError)), &lastError))
		require.Equal(t, "stalled", lastError["class"])
		require.Equal(t, []string{"lease.expired", "attempt.failed", "retry.scheduled"},
			eventNames(b.lastEvents(step, 3)))
		require.Equal(t, "stalled", b.lastEvents(step, 1)[0].Details["class"])
		b.requireStatus(taskID, "in_progress")

		// The worker of the stalled attempt is fenced out.
		require.False(t, b.complete(step, 1, `{}`, reapAt))
		require.False(t, b.boolCall(`SELECT stepready.heartbeat_step($1, 1, 1000, $2)`, step, reapAt))
	})

	t.Run("last attempt: retries_exhausted", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, step := b.oneStep(`"retry": {"max_attempts": 2}`)
		now := b.retryOnce(step, `{}`, testBase)
		require.Equal(t, 2, b.run(step, now))
		reapAt := now.Add(testLease + tick)
		require.Equal(t, 1, b.reap(reapAt, 1000))

		s := b.step(step)
		require.Equal(t, "error", s.State)
		var lastError map[string]any
		require.NoError(t, json.Unmarshal([]byte(deref(s.LastError)), &lastError))
		require.Equal(t, "stalled", lastError["class"])
		require.Equal(t, "retries_exhausted", lastError["reason"])
		b.requireStatus(taskID, "error")
	})
}

func TestReapExpiredLeasesCountAndLimit(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, ids := b.task(`{"name": "t", "steps": [{"name": "s1", "handler": "h"}, {"name": "s2", "handler": "h"},
		{"name": "s3", "handler": "h"}, {"name": "s4", "handler": "h"}, {"name": "s5", "handler": "h"},
		{"name": "live", "handler": "h"}, {"name": "idle", "handler": "h"}]}`)
	for _, name := range []string{"s1", "s2", "s3"} {
		b.enqueue(ids[name], testBase)
	}
	for _, name := range []string{"s4", "s5"} {
		b.run(ids[name], testBase)
	}
	b.run(ids["live"], testBase)
	reapAt := testBase.Add(testLease + time.Second)
	require.True(t, b.boolCall(`SELECT stepready.heartbeat_step($1, 1, $2, $3)`, ids["live"], testLeaseMs, reapAt))

	require.Equal(t, 2, b.reap(reapAt, 2))
	require.Equal(t, 0, b.reap(reapAt, 0))
	require.Equal(t, 3, b.reap(reapAt, 1000))
	require.Equal(t, 0, b.reap(reapAt, 1000))
	b.requireState(ids["live"], "in_progress")
	b.requireState(ids["idle"], "pending")
	require.Equal(t, 5, b.intCall(`SELECT count(*) FROM stepready.step_events WHERE event = 'lease.expired'`))

	requireSQLState(t, b.callErr(`SELECT stepready.reap_expired_leases($1, -1)`, reapAt), "22023", "p_limit")
}

// TestReapExpiredLeasesSkipsARowBeingCompleted: a completion holds the row lock while the reaper runs; the
// reaper skips the row (SKIP LOCKED) instead of waiting or overwriting, and the completion wins.
func TestReapExpiredLeasesSkipsARowBeingCompleted(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, step := b.oneStep("")
	attempt := b.run(step, testBase)
	late := testBase.Add(testLease + time.Minute) // the worker answers after its lease ended

	connA := b.db.Conn(t)
	txA, err := connA.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = txA.Rollback(context.Background()) }()
	var ok bool
	require.NoError(t, txA.QueryRow(b.ctx, `SELECT stepready.complete_step($1, $2, '{"v": 1}'::jsonb, $3)`,
		step, attempt, late).Scan(&ok))
	require.True(t, ok)

	// B must neither block on A's lock nor touch the row.
	ctxB, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctxB, `SELECT stepready.reap_expired_leases($1, 1000)`, late).Scan(&n))
	require.Equal(t, 0, n)

	require.NoError(t, txA.Commit(b.ctx))
	s := b.step(step)
	require.Equal(t, "complete", s.State)
	require.JSONEq(t, `{"v": 1}`, deref(s.Output))
	require.Equal(t, 0, b.reap(late, 1000))
	require.Empty(t, eventsNamed(b.events(step), "lease.expired"))
	b.requireStatus(taskID, "complete")
}

// TestReapExpiredLeasesThenLateCompletion: the reaper commits first; the worker's result afterwards is refused.
func TestReapExpiredLeasesThenLateCompletion(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, step := b.oneStep("")
	attempt := b.run(step, testBase)
	late := testBase.Add(testLease + time.Minute)
	require.Equal(t, 1, b.reap(late, 1000))
	b.requireState(step, "waiting_for_retry")
	before := b.snapshot(step)

	require.False(t, b.complete(step, attempt, `{}`, late))
	require.Equal(t, before, b.snapshot(step))
}

// TestReapExpiredLeasesHoldsTheRowWhileACompletionWaits: the reaper's transaction holds the row; a completion
// arriving meanwhile waits for it, then sees the attempt failed and is refused.
func TestReapExpiredLeasesHoldsTheRowWhileACompletionWaits(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, step := b.oneStep("")
	attempt := b.run(step, testBase)
	late := testBase.Add(testLease + time.Minute)

	reaper := b.db.Conn(t)
	tx, err := reaper.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	var n int
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT stepready.reap_expired_leases($1, 1000)`, late).Scan(&n))
	require.Equal(t, 1, n)

	worker := b.db.Conn(t)
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = worker.QueryRow(b.ctx, `SELECT stepready.complete_step($1, $2, '{}'::jsonb, $3)`,
			step, attempt, late).Scan(&r.ok)
		done <- r
	}()
	b.waitBlocked(worker.PgConn().PID())
	require.NoError(t, tx.Commit(b.ctx))

	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.False(t, r.ok, "the reaped attempt's result is refused")
	case <-time.After(20 * time.Second):
		t.Fatal("complete_step did not return after the reaper committed")
	}
	b.requireState(step, "waiting_for_retry")
	require.Equal(t, 1, b.step(step).Attempts)
}

func eventsNamed(evs []lifecycleEvent, name string) []lifecycleEvent {
	var out []lifecycleEvent
	for _, e := range evs {
		if e.Event == name {
			out = append(out, e)
		}
	}
	return out
}
