package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClaimReadyStepsClaimsOnlyReadySteps sets one step (s) per case into a condition and checks that
// claim_ready_steps takes it exactly when SPEC §5 says it is ready.
func TestClaimReadyStepsClaimsOnlyReadySteps(t *testing.T) {
	t.Parallel()
	at := testBase

	// Every case has a task with a parent p and a child s (p -> s), or a lone s, shaped by setup.
	chain := `{"name": "t", "steps": [{"name": "p", "handler": "h"},
		{"name": "s", "handler": "h", "depends_on": ["p"]}]}`
	lone := `{"name": "t", "steps": [{"name": "s", "handler": "h"}, {"name": "other", "handler": "h"}]}`

	cases := []struct {
		name  string
		def   string
		setup func(b *lifecycleBundle, ids map[string]int64, taskID int64)
		want  bool
	}{
		{"pending root", lone, func(*lifecycleBundle, map[string]int64, int64) {}, true},
		{"pending child of a pending parent", chain, func(*lifecycleBundle, map[string]int64, int64) {}, false},
		{"pending child of an in-flight parent", chain, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.run(ids["p"], at)
		}, false},
		{"child of a complete parent", chain, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.runToComplete(ids["p"], `{}`, at)
		}, true},
		{"child of a skipped parent", chain, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'skipped' WHERE id = $1`, ids["p"])
		}, true},
		{"child of a resolved_manually parent", chain, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'resolved_manually' WHERE id = $1`, ids["p"])
		}, true},
		{"backoff due exactly at as_of", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2
				WHERE id = $1`, ids["s"], at)
		}, true},
		{"backoff due 1us before as_of", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2
				WHERE id = $1`, ids["s"], at.Add(-tick))
		}, true},
		{"backoff due 1us after as_of", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2
				WHERE id = $1`, ids["s"], at.Add(tick))
		}, false},
		{"delayed first attempt not due", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, ids["s"], at.Add(time.Second))
		}, false},
		{"retries exhausted", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 3, max_attempts = 3
				WHERE id = $1`, ids["s"])
		}, false},
		{"one attempt left", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 2, max_attempts = 3
				WHERE id = $1`, ids["s"])
		}, true},
		{"not retryable after one attempt", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 1, retryable = false
				WHERE id = $1`, ids["s"])
		}, false},
		{"max_attempts 0 still allows the first attempt", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET max_attempts = 0, retryable = false WHERE id = $1`, ids["s"])
		}, true},
		{"enqueued", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) { b.enqueue(ids["s"], at) }, false},
		{"in_progress", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) { b.run(ids["s"], at) }, false},
		{"complete", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.runToComplete(ids["s"], `{}`, at)
		}, false},
		{"skipped", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'skipped' WHERE id = $1`, ids["s"])
		}, false},
		{"cancelled step", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'cancelled' WHERE id = $1`, ids["s"])
		}, false},
		{"resolved_manually", lone, func(b *lifecycleBundle, ids map[string]int64, _ int64) {
			b.exec(`UPDATE stepready.steps SET state = 'resolved_manually' WHERE id = $1`, ids["s"])
		}, false},
		{"paused task", lone, func(b *lifecycleBundle, _ map[string]int64, taskID int64) {
			require.True(b.t, b.boolCall(`SELECT stepready.pause_task($1, $2)`, taskID, at))
		}, false},
		{"task in error (a sibling failed)", lone, func(b *lifecycleBundle, ids map[string]int64, taskID int64) {
			attempt := b.run(ids["other"], at)
			b.fail(ids["other"], attempt, `{"class": "permanent"}`, at, 0)
			b.requireStatus(taskID, "error")
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, ids := b.task(tc.def)
			tc.setup(b, ids, taskID)

			claimed := b.claimIDs(at)
			require.Equal(t, tc.want, containsID(claimed, ids["s"]), "claimed %v, s = %d", claimed, ids["s"])
			if tc.want {
				b.requireState(ids["s"], "enqueued")
			}
			// Whatever was claimed was ready an instant before the claim: claiming again finds nothing new.
			require.Empty(t, b.claimIDs(at))
		})
	}
}

func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func TestClaimReadyStepsOrder(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase

	// Task A is created first (lower ids) but has the lower priority.
	_, a := b.task(`{"name": "A", "priority": 0, "steps": [
		{"name": "a1", "handler": "h"}, {"name": "a2", "handler": "h", "priority": 1}]}`)
	_, bb := b.task(`{"name": "B", "priority": 5, "steps": [
		{"name": "b1", "handler": "h"}, {"name": "b2", "handler": "h"}, {"name": "b3", "handler": "h"},
		{"name": "b4", "handler": "h"}, {"name": "b5", "handler": "h", "priority": -1}]}`)
	b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, bb["b1"], at.Add(-time.Second))
	b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, bb["b3"], at.Add(-2*time.Second))
	b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, bb["b5"], at.Add(-time.Hour))

	// Task priority desc, step priority desc, next_attempt_at nulls first then ascending, id.
	want := []int64{bb["b2"], bb["b4"], bb["b3"], bb["b1"], bb["b5"], a["a2"], a["a1"]}

	// The limit takes a prefix of that order, returned in that order.
	first := b.claim(3, at)
	require.Equal(t, want[:3], claimedIDs(first))
	rest := b.claim(100, at)
	require.Equal(t, want[3:], claimedIDs(rest))
	require.Empty(t, b.claim(100, at))
}

func TestClaimReadyStepsLimit(t *testing.T) {
	t.Parallel()

	cases := []struct {
		limit, want int
	}{
		{0, 0},
		{1, 1},
		{4, 4},
		{5, 5},
		{6, 5},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("limit %d", tc.limit), func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, _ := b.task(`{"name": "t", "steps": [{"name": "s1", "handler": "h"},
				{"name": "s2", "handler": "h"}, {"name": "s3", "handler": "h"}, {"name": "s4", "handler": "h"},
				{"name": "s5", "handler": "h"}]}`)
			before := b.taskSnapshot(taskID)

			got := b.claim(tc.limit, testBase)
			require.Len(t, got, tc.want)
			require.Equal(t, tc.want, b.intCall(`SELECT count(*) FROM stepready.steps WHERE state = 'enqueued'`))
			if tc.want == 0 {
				require.Equal(t, before, b.taskSnapshot(taskID), "limit 0 changes nothing")
				b.requireStatus(taskID, "pending")
			}
		})
	}
}

func TestClaimReadyStepsRejectsBadArguments(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name    string
		limit   int
		worker  string
		leaseMs int64
		param   string
	}{
		{"negative limit", -1, testWorker, testLeaseMs, "p_limit"},
		{"zero lease", 1, testWorker, 0, "p_lease_ms"},
		{"negative lease", 1, testWorker, -1, "p_lease_ms"},
		{"empty worker", 1, "", testLeaseMs, "p_worker"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, _ := b.oneStep("")
			before := b.taskSnapshot(taskID)
			_, err := b.claimAs(b.db.Pool, tc.limit, tc.worker, tc.leaseMs, testBase)
			requireSQLState(t, err, "22023", tc.param)
			require.Equal(t, before, b.taskSnapshot(taskID))
		})
	}
}

func TestClaimReadyStepsEffects(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskID, ids := b.task(`{"name": "t", "steps": [
		{"name": "fresh", "handler": "fetch", "input": {"url": "u"}, "timeout_ms": 5000, "queue": "q1"},
		{"name": "retry", "handler": "load", "priority": -1}]}`)
	otherTask, other := b.oneStep("")
	// "retry" failed once before: a claim returns its attempts so far.
	retryAt := b.retryOnce(ids["retry"], `{"class": "transient"}`, at.Add(-time.Hour))
	require.True(t, retryAt.Before(at))
	b.exec(`UPDATE stepready.tasks SET status = 'pending' WHERE id = $1`, taskID) // as if never claimed
	// Only the steps of one task are ready for the claim below: the other task's step waits.
	b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, other, at.Add(time.Second))

	rows, err := b.db.Pool.Query(b.ctx, `SELECT * FROM stepready.claim_ready_steps($1, $2, $3, $4)`,
		10, "w-7", int64(1500), at)
	require.NoError(t, err)
	var names []string
	for _, fd := range rows.FieldDescriptions() {
		names = append(names, fd.Name)
	}
	rows.Close()
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"step_id", "task_id", "name", "handler", "input", "attempts", "timeout_ms", "queue"},
		names)

	// The claim above already took both steps; check what it did.
	lease := at.Add(1500 * time.Millisecond)
	for _, name := range []string{"fresh", "retry"} {
		s := b.step(ids[name])
		require.Equal(t, "enqueued", s.State, name)
		require.Equal(t, "w-7", deref(s.LeaseOwner), name)
		requireTime(t, lease, s.LeaseExpiresAt, name+" lease_expires_at")
		evs := b.lastEvents(ids[name], 1)
		require.Equal(t, "step.enqueued", evs[0].Event, name)
		require.Equal(t, "enqueued", deref(evs[0].ToState), name)
		require.True(t, at.Equal(evs[0].At), name)
	}
	require.Equal(t, 0, b.step(ids["fresh"]).Attempts, "a claim charges no attempt")
	require.Equal(t, 1, b.step(ids["retry"]).Attempts, "a claim charges no attempt")
	require.Equal(t, "pending", deref(b.lastEvents(ids["fresh"], 1)[0].FromState))
	require.Equal(t, "waiting_for_retry", deref(b.lastEvents(ids["retry"], 1)[0].FromState))
	b.requireStatus(taskID, "in_progress")
	b.requireStatus(otherTask, "pending")

	// The returned values, on a fresh task.
	task2, ids2 := b.task(`{"name": "t2", "steps": [
		{"name": "fresh", "handler": "fetch", "input": {"url": "u"}, "timeout_ms": 5000, "queue": "q1"}]}`)
	b.requireStatus(task2, "pending")
	got := b.claim(10, at)
	require.Len(t, got, 1)
	require.Equal(t, claimedRow{StepID: ids2["fresh"], TaskID: task2, Name: "fresh", Handler: "fetch",
		Input: `{"url": "u"}`, Attempts: 0, TimeoutMs: ptr(int64(5000)), Queue: "q1"}, got[0])
	b.requireStatus(task2, "in_progress")

	// And a retried step reports its attempts so far.
	b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 2 WHERE id = $1`, ids2["fresh"])
	got = b.claim(10, at)
	require.Len(t, got, 1)
	require.Equal(t, 2, got[0].Attempts)
	require.Empty(t, b.claim(10, at.Add(-time.Hour)), "nothing else is due")
}

func TestStartStep(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskID, step := b.oneStep("")

	require.Equal(t, []int64{step}, b.claimIDs(at))
	startAt := at.Add(3 * time.Second)
	var attempt *int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.start_step($1, $2, $3, $4)`,
		step, "w-9", int64(2500), startAt).Scan(&attempt))
	require.Equal(t, 1, deref(attempt))

	s := b.step(step)
	require.Equal(t, "in_progress", s.State)
	require.Equal(t, 1, s.Attempts)
	requireTime(t, startAt, s.LastAttemptedAt, "last_attempted_at")
	requireTime(t, startAt.Add(2500*time.Millisecond), s.LeaseExpiresAt, "lease_expires_at")
	require.Equal(t, "w-9", deref(s.LeaseOwner))
	b.requireStatus(taskID, "in_progress")
	ev := b.lastEvents(step, 1)[0]
	require.Equal(t, "attempt.started", ev.Event)
	require.Equal(t, 1, deref(ev.Attempt))
	require.True(t, startAt.Equal(ev.At))

	// The second attempt, after a retry, is number 2.
	r := b.fail(step, 1, `{"class": "transient"}`, startAt, 0)
	retryAt := *r.NextAttemptAt
	require.Equal(t, []int64{step}, b.claimIDs(retryAt))
	require.Equal(t, 2, deref(b.start(step, retryAt)))
	require.Equal(t, 2, b.step(step).Attempts)
	requireTime(t, retryAt, b.step(step).LastAttemptedAt, "last_attempted_at")

	// Bad arguments.
	requireSQLState(t, b.callErr(`SELECT stepready.start_step($1, '', 1000, $2)`, step, at), "22023", "p_worker")
	requireSQLState(t, b.callErr(`SELECT stepready.start_step($1, 'w', 0, $2)`, step, at), "22023", "p_lease_ms")
}

func TestStartStepReturnsNullWhenNotEnqueued(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, taskID, step int64)
	}{
		{"pending (never claimed)", func(*lifecycleBundle, int64, int64) {}},
		{"in_progress (started twice)", func(b *lifecycleBundle, _, step int64) { b.run(step, at) }},
		{"waiting_for_retry", func(b *lifecycleBundle, _, step int64) { b.retryOnce(step, `{}`, at) }},
		{"complete", func(b *lifecycleBundle, _, step int64) { b.runToComplete(step, `{}`, at) }},
		{"cancelled after the claim", func(b *lifecycleBundle, taskID, step int64) {
			b.enqueue(step, at)
			require.Equal(b.t, 1, b.intCall(`SELECT stepready.cancel_task($1, 'stop', $2)`, taskID, at))
		}},
		{"reaped after the claim", func(b *lifecycleBundle, _, step int64) {
			b.enqueue(step, at)
			require.Equal(b.t, 1, b.intCall(`SELECT stepready.reap_expired_leases($1)`,
				at.Add(testLease+tick)))
			b.requireState(step, "pending")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			tc.setup(b, taskID, step)
			before := b.snapshot(step)
			require.Nil(t, b.start(step, at.Add(time.Minute)))
			require.Equal(t, before, b.snapshot(step), "start_step must change nothing")
		})
	}

	t.Run("unknown step", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		require.Nil(t, b.start(424242, at))
	})
}

func TestStartStepAfterTaskPausedHandsTheStepBack(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name          string
		priorFailures int
		wantState     string
	}{
		{"first attempt", 0, "pending"},
		{"after a failure", 1, "waiting_for_retry"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			now := at
			for range tc.priorFailures {
				now = b.retryOnce(step, `{"class": "transient"}`, now)
			}
			nextBefore := b.step(step).NextAttemptAt

			require.Equal(t, []int64{step}, b.claimIDs(now))
			require.True(t, b.boolCall(`SELECT stepready.pause_task($1, $2)`, taskID, now))
			require.Nil(t, b.start(step, now))

			s := b.step(step)
			require.Equal(t, tc.wantState, s.State)
			require.Equal(t, tc.priorFailures, s.Attempts, "uncharged")
			requireSameTime(t, nextBefore, s.NextAttemptAt, "next_attempt_at is left as it was")
			require.Nil(t, s.LeaseOwner)
			require.Nil(t, s.LeaseExpiresAt)
			ev := b.lastEvents(step, 1)[0]
			require.Equal(t, "step.released", ev.Event)
			require.Equal(t, tc.wantState, deref(ev.ToState))

			require.Empty(t, b.claimIDs(now), "still paused")
			require.True(t, b.boolCall(`SELECT stepready.resume_task($1, $2)`, taskID, now))
			require.Equal(t, []int64{step}, b.claimIDs(now), "ready again at once after resume")
			require.Equal(t, tc.priorFailures+1, deref(b.start(step, now)))
		})
	}
}

func TestHeartbeatStepExtendsTheLease(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	_, step := b.oneStep("")
	attempt := b.run(step, at)

	hb := at.Add(40 * time.Second)
	require.True(t, b.boolCall(`SELECT stepready.heartbeat_step($1, $2, $3, $4)`, step, attempt, int64(90000), hb))
	s := b.step(step)
	requireTime(t, hb.Add(90*time.Second), s.LeaseExpiresAt, "lease_expires_at")
	require.Equal(t, "in_progress", s.State)
	require.Equal(t, 1, s.Attempts)

	// The extended lease protects the attempt from the reaper past the original lease.
	require.Equal(t, 0, b.intCall(`SELECT stepready.reap_expired_leases($1)`, at.Add(testLease+time.Second)))
	b.requireState(step, "in_progress")

	requireSQLState(t, b.callErr(`SELECT stepready.heartbeat_step($1, $2, 0, $3)`, step, attempt, hb),
		"22023", "p_lease_ms")
}

func TestHeartbeatStepFencing(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, step int64) int // returns the attempt to heartbeat with
	}{
		{"attempt ahead", func(b *lifecycleBundle, step int64) int { return b.run(step, at) + 1 }},
		{"attempt 0", func(b *lifecycleBundle, step int64) int { b.run(step, at); return 0 }},
		{"stale attempt after a retry", func(b *lifecycleBundle, step int64) int {
			next := b.retryOnce(step, `{}`, at)
			b.run(step, next)
			return 1
		}},
		{"enqueued, never started", func(b *lifecycleBundle, step int64) int { b.enqueue(step, at); return 0 }},
		{"waiting_for_retry", func(b *lifecycleBundle, step int64) int { b.retryOnce(step, `{}`, at); return 1 }},
		{"complete", func(b *lifecycleBundle, step int64) int { b.runToComplete(step, `{}`, at); return 1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			_, step := b.oneStep("")
			attempt := tc.setup(b, step)
			before := b.snapshot(step)
			require.False(t, b.boolCall(`SELECT stepready.heartbeat_step($1, $2, $3, $4)`,
				step, attempt, int64(90000), at.Add(time.Hour)))
			require.Equal(t, before, b.snapshot(step))
		})
	}
}

func TestCompleteStepFencing(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, taskID, step int64) int // returns the attempt to complete with
	}{
		{"attempt ahead", func(b *lifecycleBundle, _, step int64) int { return b.run(step, at) + 1 }},
		{"stale attempt after a retry", func(b *lifecycleBundle, _, step int64) int {
			next := b.retryOnce(step, `{}`, at)
			require.Equal(b.t, 2, b.run(step, next))
			return 1
		}},
		{"enqueued, never started", func(b *lifecycleBundle, _, step int64) int { b.enqueue(step, at); return 0 }},
		{"pending", func(*lifecycleBundle, int64, int64) int { return 0 }},
		{"waiting_for_retry (the attempt already failed)", func(b *lifecycleBundle, _, step int64) int {
			b.retryOnce(step, `{}`, at)
			return 1
		}},
		{"already complete (duplicate result)", func(b *lifecycleBundle, _, step int64) int {
			b.runToComplete(step, `{"first": true}`, at)
			return 1
		}},
		// The cancelled attempt's lease is orphaned (its slot is kept while the handler may run): the refused
		// result ends it, and changes nothing else.
		{"cancelled", func(b *lifecycleBundle, taskID, step int64) int {
			attempt := b.run(step, at)
			b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, at)
			return attempt
		}},
		{"error", func(b *lifecycleBundle, _, step int64) int {
			attempt := b.run(step, at)
			b.fail(step, attempt, `{"class": "permanent"}`, at, 0)
			return attempt
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep("")
			attempt := tc.setup(b, taskID, step)
			before := b.taskSnapshotBeyondLeases(taskID)
			require.False(t, b.complete(step, attempt, `{"late": true}`, at.Add(time.Second)))
			require.Equal(t, before, b.taskSnapshotBeyondLeases(taskID), "a fenced complete_step changes nothing")
			if s := b.step(step); s.State != "enqueued" && s.State != "in_progress" {
				require.Nil(t, s.LeaseExpiresAt, "and leaves no lease outside flight")
			}
		})
	}

	t.Run("unknown step", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		require.False(t, b.complete(424242, 1, `{}`, at))
	})
}

func TestCompleteStepReadiesChildrenAndCompletesTheTask(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	// a and b are parents of join; a is also the parent of solo.
	taskID, ids := b.task(`{"name": "t", "steps": [
		{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"},
		{"name": "join", "handler": "h", "depends_on": ["a", "b"]},
		{"name": "solo", "handler": "h", "depends_on": ["a"]}]}`)
	require.ElementsMatch(t, []int64{ids["a"], ids["b"]}, b.claimIDs(at))
	attemptA := deref(b.start(ids["a"], at))
	attemptB := deref(b.start(ids["b"], at))

	done := at.Add(time.Second)
	require.True(t, b.complete(ids["a"], attemptA, `{"a": 1}`, done))
	a := b.step(ids["a"])
	require.Equal(t, "complete", a.State)
	require.JSONEq(t, `{"a": 1}`, deref(a.Output))
	requireTime(t, done, a.CompletedAt, "completed_at")
	require.Nil(t, a.LeaseOwner)
	require.Equal(t, []string{"attempt.succeeded", "step.completed"}, eventNames(b.lastEvents(ids["a"], 2)))

	require.Equal(t, 0, b.step(ids["solo"]).PendingParents)
	require.Equal(t, 1, b.step(ids["join"]).PendingParents)
	b.requireReady(ids["solo"], done)
	b.requireNotReady(ids["join"], done, "waiting_for_dependencies")
	require.Equal(t, []int64{ids["solo"]}, b.claimIDs(done))
	b.requireStatus(taskID, "in_progress")

	require.True(t, b.complete(ids["b"], attemptB, `{"b": 2}`, done))
	require.Equal(t, 0, b.step(ids["join"]).PendingParents)
	require.Equal(t, []int64{ids["join"]}, b.claimIDs(done))

	end := done.Add(time.Second)
	for _, name := range []string{"solo", "join"} {
		require.True(t, b.complete(ids[name], deref(b.start(ids[name], done)), `{}`, end))
		if name == "solo" {
			b.requireStatus(taskID, "in_progress")
			require.Nil(t, b.taskRow(taskID).CompletedAt)
		}
	}
	tk := b.taskRow(taskID)
	require.Equal(t, "complete", tk.Status)
	require.NotNil(t, tk.CompletedAt)
}

func TestCompleteStepCollect(t *testing.T) {
	t.Parallel()

	cases := []struct {
		collect string
		output  string
		want    string
	}{
		{"replace", `{"x": 1}`, `{"x": 1}`},
		{"append", `{"x": 1}`, `[{"x": 1}]`},
		{"append", `"scalar"`, `["scalar"]`},
		{"merge", `{"x": 1}`, `{"x": 1}`},
	}
	for _, tc := range cases {
		t.Run(tc.collect+" "+tc.output, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			_, step := b.oneStep(`"collect": "` + tc.collect + `"`)
			attempt := b.run(step, testBase)
			require.True(t, b.complete(step, attempt, tc.output, testBase))
			require.JSONEq(t, tc.want, deref(b.step(step).Output))
		})
	}

	t.Run("merge with a non-object output", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		_, step := b.oneStep(`"collect": "merge"`)
		attempt := b.run(step, testBase)
		before := b.snapshot(step)
		err := b.callErr(`SELECT stepready.complete_step($1, $2, '[1, 2]'::jsonb, $3)`, step, attempt, testBase)
		requireSQLState(t, err, "22023")
		require.Equal(t, before, b.snapshot(step))
	})
}

// continueStep calls continue_step; nextInput and delay may be nil.
func (b *lifecycleBundle) continueStep(step int64, attempt int, output string, nextInput *string, delayMs any,
	asOf time.Time,
) bool {
	b.t.Helper()
	return b.boolCall(`SELECT stepready.continue_step($1, $2, $3::jsonb, $4::jsonb, $5, $6)`,
		step, attempt, output, nextInput, delayMs, asOf)
}

func TestContinueStep(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name      string
		nextInput *string
		delayMs   int64
		wantInput string
	}{
		{"new input and a delay", ptr(`{"page": 2}`), 1500, `{"page": 2}`},
		{"input kept when p_next_input is NULL", nil, 1500, `{"page": 1}`},
		{"zero delay", ptr(`{"page": 2}`), 0, `{"page": 2}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep(`"input": {"page": 1}`)
			// A failed attempt first, so the reset of attempts is visible.
			next := b.retryOnce(step, `{"class": "transient"}`, at)
			attempt := b.run(step, next)
			require.Equal(t, 2, attempt)

			require.True(t, b.continueStep(step, attempt, `{"items": 10}`, tc.nextInput, tc.delayMs, next))
			s := b.step(step)
			require.Equal(t, "pending", s.State)
			require.Equal(t, 1, s.Iteration)
			require.Equal(t, 0, s.Attempts, "each iteration has its own retry budget")
			require.JSONEq(t, tc.wantInput, s.Input)
			require.JSONEq(t, `{"items": 10}`, deref(s.Output))
			due := next.Add(time.Duration(tc.delayMs) * time.Millisecond)
			requireTime(t, due, s.NextAttemptAt, "next_attempt_at")
			require.Nil(t, s.LeaseOwner)
			b.requireStatus(taskID, "in_progress")

			ev := b.lastEvents(step, 1)[0]
			require.Equal(t, "iteration.continued", ev.Event)
			require.Equal(t, "pending", deref(ev.ToState))
			require.EqualValues(t, tc.delayMs, ev.Details["delay_ms"])
			require.True(t, next.Equal(ev.At))

			if tc.delayMs > 0 {
				b.requireNotReady(step, due.Add(-tick), "backoff")
				require.Empty(t, b.claimIDs(due.Add(-tick)))
			}
			require.Equal(t, []int64{step}, b.claimIDs(due))
			got := b.step(step)
			require.JSONEq(t, tc.wantInput, got.Input)
			token := deref(b.start(step, due))
			require.Equal(t, 1, b.step(step).Attempts, "the new iteration starts at attempt 1")
			require.Equal(t, attempt+1, token, "its fencing token goes on from the last attempt's: it never repeats")
		})
	}
}

func TestContinueStepGivesEachIterationItsOwnRetryBudget(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, step := b.oneStep(`"retry": {"max_attempts": 3}`)
	now := testBase

	// Iteration 0: two failures, then a success that continues.
	now = b.retryOnce(step, `{"class": "transient"}`, now)
	now = b.retryOnce(step, `{"class": "transient"}`, now)
	attempt := b.run(step, now)
	require.Equal(t, 3, attempt)
	require.True(t, b.continueStep(step, attempt, `{}`, nil, 0, now))

	// Iteration 1: two more failures still retry (3 + 2 attempts in all, more than max_attempts).
	now = b.retryOnce(step, `{"class": "transient"}`, now)
	now = b.retryOnce(step, `{"class": "transient"}`, now)
	require.Equal(t, 2, b.step(step).Attempts)
	require.Equal(t, 1, b.step(step).Iteration)
	// And the budget of iteration 1 ends at its third attempt (the sixth fencing token of the step).
	attempt = b.run(step, now)
	require.Equal(t, 3, b.step(step).Attempts)
	require.Equal(t, 6, attempt)
	r := b.fail(step, attempt, `{"class": "transient"}`, now, 0)
	require.Equal(t, "error", deref(r.State))
	require.Equal(t, "retries_exhausted", deref(r.Reason))
}

func TestContinueStepCollect(t *testing.T) {
	t.Parallel()

	cases := []struct {
		collect string
		want    string
	}{
		{"append", `[{"a": 1, "b": 1}, {"b": 2}, {"c": 3}]`},
		{"replace", `{"c": 3}`},
		{"merge", `{"a": 1, "b": 2, "c": 3}`},
	}
	for _, tc := range cases {
		t.Run(tc.collect, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			_, step := b.oneStep(`"collect": "` + tc.collect + `"`)
			now := testBase
			for _, out := range []string{`{"a": 1, "b": 1}`, `{"b": 2}`} {
				require.True(t, b.continueStep(step, b.run(step, now), out, nil, 0, now))
			}
			require.True(t, b.complete(step, b.run(step, now), `{"c": 3}`, now))
			require.JSONEq(t, tc.want, deref(b.step(step).Output))
		})
	}

	t.Run("merge with a non-object output", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		_, step := b.oneStep(`"collect": "merge"`)
		attempt := b.run(step, testBase)
		before := b.snapshot(step)
		err := b.callErr(`SELECT stepready.continue_step($1, $2, '"text"'::jsonb, NULL, 0, $3)`,
			step, attempt, testBase)
		requireSQLState(t, err, "22023")
		require.Equal(t, before, b.snapshot(step))
	})
}

func TestContinueStepMaxIterations(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name          string
		extra         string
		startAt       int // iteration set before the first run
		wantContinues int // continues that stay pending before the one that completes
	}{
		{"max_iterations 1: the first continue completes", `"max_iterations": 1`, 0, 0},
		{"max_iterations 3: three runs", `"max_iterations": 3`, 0, 2},
		{"NULL means 1000", ``, 998, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			extra := `"collect": "append"`
			if tc.extra != "" {
				extra += ", " + tc.extra
			}
			taskID, step := b.oneStep(extra)
			if tc.startAt > 0 {
				b.exec(`UPDATE stepready.steps SET iteration = $2 WHERE id = $1`, step, tc.startAt)
			}
			now := testBase
			for i := range tc.wantContinues {
				require.True(t, b.continueStep(step, b.run(step, now), `{"i": 1}`, nil, 0, now))
				s := b.step(step)
				require.Equal(t, "pending", s.State, "continue %d", i)
				require.Equal(t, tc.startAt+i+1, s.Iteration)
			}
			require.True(t, b.continueStep(step, b.run(step, now), `{"i": 1}`, ptr(`{"next": true}`), 5000, now))
			s := b.step(step)
			require.Equal(t, "complete", s.State, "reaching max_iterations completes the step")
			require.Nil(t, s.NextAttemptAt)
			require.Equal(t, "step.completed", b.lastEvents(step, 1)[0].Event)
			b.requireStatus(taskID, "complete")
			if tc.startAt == 0 {
				var n int
				require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT jsonb_array_length(output) FROM stepready.steps
					WHERE id = $1`, step).Scan(&n))
				require.Equal(t, tc.wantContinues+1, n, "every run's output is collected")
			}
		})
	}
}

func TestContinueStepRejectsNegativeDelay(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, step := b.oneStep("")
	attempt := b.run(step, testBase)
	before := b.snapshot(step)
	err := b.callErr(`SELECT stepready.continue_step($1, $2, '{}'::jsonb, NULL, -1, $3)`, step, attempt, testBase)
	requireSQLState(t, err, "22023", "p_delay_ms")
	require.Equal(t, before, b.snapshot(step))
}

func TestContinueStepFencing(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, step int64) int
	}{
		{"attempt ahead", func(b *lifecycleBundle, step int64) int { return b.run(step, at) + 1 }},
		{"stale attempt after a retry", func(b *lifecycleBundle, step int64) int {
			b.run(step, b.retryOnce(step, `{}`, at))
			return 1
		}},
		{"enqueued", func(b *lifecycleBundle, step int64) int { b.enqueue(step, at); return 0 }},
		{"complete", func(b *lifecycleBundle, step int64) int { b.runToComplete(step, `{}`, at); return 1 }},
		{"already continued (duplicate)", func(b *lifecycleBundle, step int64) int {
			attempt := b.run(step, at)
			require.True(b.t, b.continueStep(step, attempt, `{}`, nil, 0, at))
			return attempt
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			_, step := b.oneStep("")
			attempt := tc.setup(b, step)
			before := b.snapshot(step)
			require.False(t, b.continueStep(step, attempt, `{}`, ptr(`{"x": 1}`), 10, at.Add(time.Second)))
			require.Equal(t, before, b.snapshot(step))
		})
	}
}

func TestReleaseStep(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name         string
		setup        func(b *lifecycleBundle, step int64) *int // the attempt to release with (nil = SQL NULL)
		wantState    string
		wantAttempts int
	}{
		{"in_progress first attempt", func(b *lifecycleBundle, step int64) *int { return ptr(b.run(step, at)) },
			"pending", 0},
		{"in_progress after a failure", func(b *lifecycleBundle, step int64) *int {
			return ptr(b.run(step, b.retryOnce(step, `{}`, at)))
		}, "waiting_for_retry", 1},
		{"enqueued, attempt NULL", func(b *lifecycleBundle, step int64) *int { b.enqueue(step, at); return nil },
			"pending", 0},
		{"enqueued, attempt equal to attempts", func(b *lifecycleBundle, step int64) *int {
			b.enqueue(step, at)
			return ptr(0)
		}, "pending", 0},
		{"enqueued after a failure, attempt NULL", func(b *lifecycleBundle, step int64) *int {
			b.enqueue(step, b.retryOnce(step, `{}`, at))
			return nil
		}, "waiting_for_retry", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			_, step := b.oneStep("")
			attempt := tc.setup(b, step)
			nextBefore := b.step(step).NextAttemptAt
			releaseAt := at.Add(time.Hour)

			require.True(t, b.boolCall(`SELECT stepready.release_step($1, $2, $3)`, step, attempt, releaseAt))
			s := b.step(step)
			require.Equal(t, tc.wantState, s.State)
			require.Equal(t, tc.wantAttempts, s.Attempts, "released uncharged")
			requireSameTime(t, nextBefore, s.NextAttemptAt, "next_attempt_at")
			require.Nil(t, s.LeaseOwner)
			require.Nil(t, s.LeaseExpiresAt)
			ev := b.lastEvents(step, 1)[0]
			require.Equal(t, "step.released", ev.Event)
			require.Equal(t, tc.wantState, deref(ev.ToState))
			require.True(t, releaseAt.Equal(ev.At))

			// Immediately ready again, and the next attempt has the same number as the released one would, with a
			// fencing token of its own (the released attempt's is never given again).
			require.Equal(t, []int64{step}, b.claimIDs(releaseAt))
			token := deref(b.start(step, releaseAt))
			require.Equal(t, tc.wantAttempts+1, b.step(step).Attempts)
			if attempt != nil {
				require.Equal(t, *attempt+1, token)
			} else {
				require.Equal(t, tc.wantAttempts+1, token)
			}
		})
	}
}

func TestReleaseStepFencing(t *testing.T) {
	t.Parallel()
	at := testBase

	cases := []struct {
		name  string
		setup func(b *lifecycleBundle, step int64) *int
	}{
		{"in_progress, attempt ahead", func(b *lifecycleBundle, step int64) *int { return ptr(b.run(step, at) + 1) }},
		{"in_progress, attempt NULL", func(b *lifecycleBundle, step int64) *int { b.run(step, at); return nil }},
		{"in_progress, stale attempt", func(b *lifecycleBundle, step int64) *int {
			b.run(step, b.retryOnce(step, `{}`, at))
			return ptr(1)
		}},
		{"enqueued, attempt ahead", func(b *lifecycleBundle, step int64) *int { b.enqueue(step, at); return ptr(1) }},
		{"pending", func(*lifecycleBundle, int64) *int { return nil }},
		{"waiting_for_retry", func(b *lifecycleBundle, step int64) *int { b.retryOnce(step, `{}`, at); return ptr(1) }},
		{"complete", func(b *lifecycleBundle, step int64) *int { b.runToComplete(step, `{}`, at); return ptr(1) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			_, step := b.oneStep("")
			attempt := tc.setup(b, step)
			before := b.snapshot(step)
			require.False(t, b.boolCall(`SELECT stepready.release_step($1, $2, $3)`, step, attempt, at))
			require.Equal(t, before, b.snapshot(step))
		})
	}
}
