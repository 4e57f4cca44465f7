package integration

// Issue 27, findings 2, 6 and 7: the fencing token never repeats for a step; a concurrency slot is held until the
// attempt really ends (its result, its release, or its lease expiring), never freed by an operator while the
// handler may still run; operators, the pruner and the lifecycle functions lock in one order.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// requireOldRunRefused plays every call an attempt's worker can make with token old, at asOf, and requires each to
// be refused and to change nothing in the task (snapshot taken before, with the leases of steps outside flight
// left out when beyondLeases: the first refused call ends an orphaned lease of the attempt, and only that).
func (b *lifecycleBundle) requireOldRunRefused(taskID, step int64, old int, asOf time.Time, beyondLeases bool) {
	b.t.Helper()
	snap := b.taskSnapshot
	if beyondLeases {
		snap = b.taskSnapshotBeyondLeases
	}
	before := snap(taskID)
	require.False(b.t, b.boolCall(`SELECT stepready.heartbeat_step($1, $2, 90000, $3)`, step, old, asOf),
		"heartbeat of the old run")
	require.False(b.t, b.complete(step, old, `{"old": true}`, asOf), "complete of the old run")
	require.Equal(b.t, "stale_attempt", deref(b.fail(step, old, `{"class": "transient"}`, asOf, 0).Reason),
		"fail of the old run")
	require.False(b.t, b.continueStep(step, old, `{"old": true}`, ptr(`{"old": true}`), 0, asOf),
		"continue of the old run")
	require.False(b.t, b.boolCall(`SELECT stepready.release_step($1, $2, $3)`, step, old, asOf),
		"release of the old run")
	require.False(b.t, b.boolCall(`SELECT stepready.record_policy_evaluation($1, $2, '{}', $3)`, step, old, asOf),
		"policy evaluation of the old run")
	require.Equal(b.t, before, snap(taskID), "the old run's calls change nothing")
}

// TestFencingTokenNeverRepeats: every way an attempt number comes back (reset, release, a new iteration after a
// reap) gives the new run a token the old run never had, so the old run's heartbeat and results are refused
// while the new run runs, and the new run's are recorded. Before schema version 9 the token was the attempt
// number, and every case but "resolve" let the old run's calls through.
func TestFencingTokenNeverRepeats(t *testing.T) {
	t.Parallel()
	const def = `"retry": {"max_attempts": 5, "backoff": "fixed", "base_delay_ms": 0}`
	t0 := testBase
	t1 := t0.Add(testLease + tick) // the old run's lease has expired: it runs on, cut off (a partition, a pause)
	cases := []struct {
		name string
		// run starts the old run at t0, takes it away, starts the new run; it returns both tokens and the new
		// run's attempt number (0: no new run).
		run func(b *lifecycleBundle, taskID, step int64) (old, cur, attempt int)
	}{
		{"cancel + reset during an attempt", func(b *lifecycleBundle, taskID, step int64) (int, int, int) {
			old := b.run(step, t0)
			b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, t0)
			require.Equal(b.t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, t0))
			cur := b.run(step, t1)
			return old, cur, 1
		}},
		{"reap + re-claim during an attempt", func(b *lifecycleBundle, _, step int64) (int, int, int) {
			old := b.run(step, t0)
			require.Equal(b.t, 1, b.reap(t1, 10))
			return old, b.run(step, t1), 2
		}},
		{"reap + reset + re-claim", func(b *lifecycleBundle, taskID, step int64) (int, int, int) {
			old := b.run(step, t0)
			b.exec(`UPDATE stepready.steps SET max_attempts = 1 WHERE id = $1`, step)
			require.Equal(b.t, 1, b.reap(t1, 10))
			b.requireState(step, "error")
			require.Equal(b.t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, t1))
			return old, b.run(step, t1), 1
		}},
		{"continue + reap + re-claim", func(b *lifecycleBundle, _, step int64) (int, int, int) {
			old := b.run(step, t0) // iteration 0, attempt 1: reaped, runs on
			require.Equal(b.t, 1, b.reap(t1, 10))
			second := b.run(step, t1) // iteration 0, attempt 2: continues
			require.True(b.t, b.continueStep(step, second, `{}`, nil, 0, t1))
			return old, b.run(step, t1), 1 // iteration 1, attempt 1 again
		}},
		{"release + re-claim", func(b *lifecycleBundle, _, step int64) (int, int, int) {
			old := b.run(step, t0)
			require.True(b.t, b.boolCall(`SELECT stepready.release_step($1, $2, $3)`, step, old, t0))
			return old, b.run(step, t1), 1
		}},
		{"resolve during an attempt", func(b *lifecycleBundle, _, step int64) (int, int, int) {
			old := b.run(step, t0)
			require.True(b.t, b.boolCall(`SELECT stepready.resolve_step($1, '{"by": "hand"}', $2)`, step, t0))
			return old, 0, 0
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, step := b.oneStep(def)
			old, cur, attempt := tc.run(b, taskID, step)
			if cur == 0 {
				b.requireOldRunRefused(taskID, step, old, t1, true)
				require.JSONEq(t, `{"by": "hand"}`, deref(b.step(step).Output))
				return
			}
			require.Greater(t, cur, old, "the new run's token is past the old run's")
			s := b.step(step)
			require.Equal(t, "in_progress", s.State)
			require.Equal(t, attempt, s.Attempts, "the new run's attempt number")
			require.Equal(t, cur, s.FenceToken)

			b.requireOldRunRefused(taskID, step, old, t1, false)
			// The new run is untouched: its heartbeat and result pass.
			require.True(t, b.boolCall(`SELECT stepready.heartbeat_step($1, $2, 90000, $3)`, step, cur, t1))
			require.True(t, b.complete(step, cur, `{"new": true}`, t1))
			require.JSONEq(t, `{"new": true}`, deref(b.step(step).Output))
			// The old run stays refused once the step is complete.
			b.requireOldRunRefused(taskID, step, old, t1, false)
		})
	}
}

// TestStartFunctionsReturnTokenAndAttemptNumber: start_step, start_steps and claim_and_start_steps give the token
// in `attempt` (start_step's int) and the attempt number users see in `attempt_number`; events record the number.
func TestStartFunctionsReturnTokenAndAttemptNumber(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, step := b.oneStep(`"retry": {"max_attempts": 5, "backoff": "fixed", "base_delay_ms": 0}`)
	at := testBase

	got := b.claimAndStart(10, at)
	require.Len(t, got, 1)
	require.Equal(t, 1, deref(got[0].Attempt))
	require.Equal(t, 1, deref(got[0].AttemptNumber))
	b.fail(step, 1, `{"class": "permanent"}`, at, 0)
	require.Equal(t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, at))

	// claim_and_start_steps after the reset: attempt 1 again, token 2.
	got = b.claimAndStart(10, at)
	require.Len(t, got, 1)
	require.Equal(t, 2, deref(got[0].Attempt), "token")
	require.Equal(t, 1, deref(got[0].AttemptNumber), "attempt number")
	require.Equal(t, 1, deref(b.lastEvents(step, 1)[0].Attempt), "attempt.started records the attempt number")
	require.True(t, b.boolCall(`SELECT stepready.release_step($1, 2, $2)`, step, at))

	// start_steps after claim_ready_steps: attempt 1 again, token 3.
	require.Equal(t, []int64{step}, b.claimIDs(at))
	starts := b.startSteps([]int64{step}, at)
	require.Equal(t, 3, deref(starts[step].Attempt), "token")
	require.Equal(t, 1, deref(starts[step].AttemptNumber), "attempt number")
	require.True(t, b.boolCall(`SELECT stepready.release_step($1, 3, $2)`, step, at))

	// start_step: the token.
	require.Equal(t, []int64{step}, b.claimIDs(at))
	require.Equal(t, 4, deref(b.start(step, at)))
	require.Equal(t, 1, b.step(step).Attempts)
	// A step no longer enqueued: NULL in both columns.
	starts = b.startSteps([]int64{step}, at)
	require.Nil(t, starts[step].Attempt)
	require.Nil(t, starts[step].AttemptNumber)
}

// TestFencingTokenFollowsAttemptsSetByHand: a fixture or a repair that sets attempts by hand (a row inserted in
// flight, an UPDATE) moves the token along, and a lowered token is put back: the token is never below the attempt
// count and never goes down.
func TestFencingTokenFollowsAttemptsSetByHand(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID := b.intCall(`INSERT INTO stepready.tasks (name) VALUES ('t') RETURNING id::int`)
	step := int64(b.intCall(`INSERT INTO stepready.steps (task_id, name, handler, state, attempts, lease_owner,
		lease_expires_at) VALUES ($1, 's', 'h', 'in_progress', 2, 'w', $2) RETURNING id::int`, taskID,
		testBase.Add(testLease)))
	require.Equal(t, 2, b.step(step).FenceToken)
	b.exec(`UPDATE stepready.steps SET attempts = 3 WHERE id = $1`, step)
	require.Equal(t, 3, b.step(step).FenceToken)
	b.exec(`UPDATE stepready.steps SET fence_token = 1, attempts = 0 WHERE id = $1`, step)
	require.Equal(t, 3, b.step(step).FenceToken, "never lowered")
	require.True(t, b.complete(step, 3, `{}`, testBase))
}

// keyedRunning creates n one-step tasks on concurrency key k (limit 1 unless more) and starts the first step.
func (b *lifecycleBundle) keyedRunning(n, limit int, at time.Time) (tasks, steps []int64, token int) {
	b.t.Helper()
	steps = b.keyedTasks(n, fmt.Sprintf(`"concurrency": {"key": "k", "limit": %d},
		"retry": {"max_attempts": 5, "backoff": "fixed", "base_delay_ms": 0}`, limit))
	tasks = make([]int64, n)
	for i, s := range steps {
		tasks[i] = b.step(s).TaskID
	}
	got := b.startIDs(1, at)
	require.Equal(b.t, steps[:1], got)
	return tasks, steps, b.attemptOf(steps[0])
}

// TestOperatorsKeepTheSlotWhileTheAttemptRuns: with a limit of 1, cancel, resolve and reset of a running step do
// not free the key's slot: the next step of the key starts only once the old attempt has ended, by its worker's
// report or by its lease expiring (strictly: at lease_expires_at it still holds the slot, a microsecond later it
// does not). Before schema version 9 the next step was claimable right after the operator's action.
func TestOperatorsKeepTheSlotWhileTheAttemptRuns(t *testing.T) {
	t.Parallel()
	at := testBase
	lease := at.Add(testLease)
	ops := []struct {
		name string
		act  func(b *lifecycleBundle, taskID, step int64)
	}{
		{"cancel", func(b *lifecycleBundle, taskID, _ int64) {
			b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, at)
		}},
		{"resolve", func(b *lifecycleBundle, _, step int64) {
			require.True(b.t, b.boolCall(`SELECT stepready.resolve_step($1, '{}', $2)`, step, at))
		}},
		{"cancel + reset", func(b *lifecycleBundle, taskID, _ int64) {
			b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, at)
			require.Equal(b.t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, at))
		}},
	}
	ends := []struct {
		name string
		end  func(b *lifecycleBundle, step int64, token int) time.Time // returns when the slot is free
	}{
		{"the worker reports", func(b *lifecycleBundle, step int64, token int) time.Time {
			require.Equal(b.t, "stale_attempt",
				deref(b.fail(step, token, `{"class": "canceled"}`, at.Add(time.Second), 0).Reason))
			return at.Add(time.Second)
		}},
		{"the worker releases", func(b *lifecycleBundle, step int64, token int) time.Time {
			require.False(b.t, b.boolCall(`SELECT stepready.release_step($1, $2, $3)`, step, token, at))
			return at
		}},
		{"the lease expires", func(b *lifecycleBundle, step int64, token int) time.Time {
			// A heartbeat of the orphaned attempt neither extends nor ends it.
			require.False(b.t, b.boolCall(`SELECT stepready.heartbeat_step($1, $2, 600000, $3)`, step, token, at))
			require.Equal(b.t, 1, b.intCall(`SELECT stepready._flow_in_flight('k', $1)`, lease))
			require.Empty(b.t, b.startIDs(10, lease), "at lease_expires_at the lease still holds")
			return lease.Add(tick)
		}},
	}
	for _, op := range ops {
		for _, end := range ends {
			t.Run(op.name+", then "+end.name, func(t *testing.T) {
				t.Parallel()
				b := lifecycleSetup(t)
				tasks, steps, token := b.keyedRunning(2, 1, at)
				op.act(b, tasks[0], steps[0])
				require.Equal(t, 1, b.inFlight("k"), "the old attempt still holds the slot")
				b.requireNotReady(steps[1], at, "concurrency_limited")
				require.Empty(t, b.startIDs(10, at))
				if op.name == "cancel + reset" {
					// The reset step waits for its own old attempt too (never two runs of one step).
					b.requireNotReady(steps[0], at, "in_flight")
					require.Contains(t, b.explainMessages(steps[0], at)[0], "an earlier attempt (worker worker-1)")
				}

				free := end.end(b, steps[0], token)
				require.Equal(t, 0, b.intCall(`SELECT stepready._flow_in_flight('k', $1)`, free))
				got := b.startIDs(10, free)
				require.Len(t, got, 1, "exactly one slot, and it is free")
				if op.name == "cancel + reset" {
					// In due order: the reset step (its hold ended) and the waiting step compete for the slot.
					require.Subset(t, steps, got)
				} else {
					require.Equal(t, steps[1:2], got)
				}
			})
		}
	}
}

// TestResetWaitsForTheOldAttempt: a step reset (or retried now) while its cancelled attempt may still run is not
// due before that attempt has ended: claims skip it until its lease's end (microsecond boundary), and the old
// worker's report makes it due at once. Readiness says in_flight meanwhile, and the reaper clears an expired
// orphaned lease with a lease.expired event.
func TestResetWaitsForTheOldAttempt(t *testing.T) {
	t.Parallel()
	at := testBase
	lease := at.Add(testLease)

	t.Run("until the lease ends", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, step := b.oneStep("")
		token := b.run(step, at)
		b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, at)
		require.Equal(t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, at))
		// retry_step_now clears a backoff, not the wait for the old attempt.
		require.True(t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, step, at))
		b.requireNotReady(step, lease, "in_flight")
		require.Empty(t, b.claimIDs(lease))
		require.Equal(t, 1, b.intCall(`SELECT in_flight_steps FROM stepready.task_execution_context($1, $2)`,
			taskID, lease))
		require.Equal(t, "processing", b.strCall(`SELECT execution_status FROM stepready.task_execution_context($1, $2)`,
			taskID, lease))
		requireTime(t, lease.Add(tick), b.strTimeCall(`SELECT stepready.next_claim_at($1)`, at), "next_claim_at")

		b.requireReady(step, lease.Add(tick))
		require.Equal(t, 1, b.reap(lease.Add(tick), 10), "the reaper clears the expired orphaned lease")
		ev := b.lastEvents(step, 1)[0]
		require.Equal(t, "lease.expired", ev.Event)
		require.Equal(t, true, ev.Details["orphaned"])
		require.Nil(t, b.step(step).LeaseExpiresAt)
		require.Equal(t, []int64{step}, b.claimIDs(lease.Add(tick)))
		require.Equal(t, token+1, deref(b.start(step, lease.Add(tick))))
	})

	t.Run("until the old worker reports", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, step := b.oneStep("")
		token := b.run(step, at)
		b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, taskID, at)
		require.Equal(t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, at))
		require.Empty(t, b.claimIDs(at))
		require.False(t, b.complete(step, token, `{}`, at))
		s := b.step(step)
		require.Nil(t, s.LeaseExpiresAt)
		require.Nil(t, s.NextAttemptAt, "due at once")
		b.requireReady(step, at)
		require.Equal(t, []int64{step}, b.claimIDs(at))
	})
}

// TestPruneKeepsTasksWhoseAttemptMayRun: a cancelled task whose attempt still holds its (orphaned) lease is not
// pruned until the attempt has ended, so its slot is never freed under a running handler.
func TestPruneKeepsTasksWhoseAttemptMayRun(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	tasks, steps, token := b.keyedRunning(2, 1, at)
	b.intCall(`SELECT stepready.cancel_task($1, NULL, $2)`, tasks[0], at)
	require.Equal(t, 0, b.intCall(`SELECT stepready.prune_tasks($1, '{cancelled}')`, at.Add(time.Hour)))
	require.Equal(t, 1, b.inFlight("k"))
	require.False(t, b.complete(steps[0], token, `{}`, at))
	require.Equal(t, 1, b.intCall(`SELECT stepready.prune_tasks($1, '{cancelled}')`, at.Add(time.Hour)))
}

func (b *lifecycleBundle) strCall(sql string, args ...any) string {
	b.t.Helper()
	var s string
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&s))
	return s
}

func (b *lifecycleBundle) strTimeCall(sql string, args ...any) *time.Time {
	b.t.Helper()
	var at *time.Time
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&at))
	return at
}

// TestOperatorsPruneAndWorkersNeverDeadlock runs the operator functions, prune_tasks and a worker's lifecycle
// functions against each other on the same tasks, from several connections, for many rounds, while new finished
// tasks keep coming. Every function locks steps before tasks (docs/design-core.md, "Lock order"): no operator and
// no prune ever fails with 40P01 (a worker's call may be chosen by PostgreSQL to break a cycle with an operator's
// locking and is retried, as the daemon does), and nothing is lost: every task is either pruned whole (steps and
// events with it) or still there with consistent counters. Before this change prune_tasks locked tasks before
// their steps and reset_task, cancel_task, retry_step_now and resolve_step the other way round: 40P01 on both
// sides.
func TestOperatorsPruneAndWorkersNeverDeadlock(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	const operators, rounds = 5, 150
	at := testBase
	ctx, cancel := context.WithTimeout(b.ctx, 4*time.Minute)
	defer cancel()
	var created, pruned, workerDeadlocks atomic.Int64
	errs := make(chan error, operators+4)
	var ops, background sync.WaitGroup
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}

	// New tasks, finished at once (failed or cancelled), like the ones a retention prunes.
	feed := func(i int) error {
		var id int64
		err := b.db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, fmt.Sprintf(
			`{"name": "t%d", "retry": {"max_attempts": 2, "backoff": "fixed", "base_delay_ms": 0},
			  "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h", "depends_on": ["a"]},
			            {"name": "c", "handler": "h"}, {"name": "d", "handler": "h", "depends_on": ["c"]}]}`, i)).
			Scan(&id)
		if err != nil {
			return err
		}
		created.Add(1)
		_, err = b.db.Pool.Exec(ctx, `SELECT stepready.cancel_task($1, 'feed', $2)`, id, at)
		if code := sqlState(err); code == "55000" || code == "P0002" {
			return nil // an operator got there first
		}
		return err
	}
	for i := range 30 {
		require.NoError(t, feed(i))
	}
	background.Add(1)
	go func() {
		defer background.Done()
		for i := 30; !stopped(); i++ {
			if err := feed(i); err != nil {
				errs <- fmt.Errorf("feed: %w", err)
				return
			}
		}
	}()

	// Operators: every function of SPEC §9 on random tasks; refusals (55000) and tasks pruned meanwhile (P0002)
	// are expected, nothing else.
	for w := range operators {
		ops.Add(1)
		go func() {
			defer ops.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 27))
			for range rounds {
				var sql string
				switch rng.IntN(6) {
				case 0, 1:
					sql = `SELECT stepready.reset_task(t.id, $1)::text FROM stepready.tasks t`
				case 2:
					sql = `SELECT stepready.cancel_task(t.id, 'stress', $1)::text FROM stepready.tasks t`
				case 3:
					sql = `SELECT stepready.retry_step_now(s.id, $1)::text FROM stepready.tasks t
						JOIN stepready.steps s ON s.task_id = t.id AND s.name = 'a'`
				case 4:
					sql = `SELECT stepready.resolve_step(s.id, '{}', $1)::text FROM stepready.tasks t
						JOIN stepready.steps s ON s.task_id = t.id AND s.name = 'c'`
				default:
					sql = `SELECT stepready.pause_task(t.id, $1)::text || stepready.resume_task(t.id, $1)::text
						FROM stepready.tasks t`
				}
				// One random task, the oldest ones (the pruner's next) most often.
				sql += fmt.Sprintf(` WHERE t.id = (SELECT id FROM stepready.tasks ORDER BY id OFFSET %d LIMIT 1)`,
					rng.IntN(1+rng.IntN(20)))
				if _, err := b.db.Pool.Exec(ctx, sql, at.Add(time.Minute)); err != nil {
					if code := sqlState(err); code != "55000" && code != "P0002" {
						errs <- fmt.Errorf("operator: %s: %w", sql, err)
						return
					}
				}
			}
		}()
	}
	// Two pruners: batches of the oldest finished tasks, in a loop.
	for range 2 {
		background.Add(1)
		go func() {
			defer background.Done()
			for !stopped() {
				var n int64
				err := b.db.Pool.QueryRow(ctx, `SELECT stepready.prune_tasks($1, '{complete,error,cancelled}', 10)`,
					at.Add(24*time.Hour)).Scan(&n)
				if err != nil {
					errs <- fmt.Errorf("prune_tasks: %w", err)
					return
				}
				pruned.Add(n)
			}
		}()
	}
	// A worker: claims, starts and finishes what the operators make ready, half successes, half permanent
	// failures (a task going into error makes its triggers change its other steps).
	background.Add(1)
	go func() {
		defer background.Done()
		rng := rand.New(rand.NewPCG(99, 27))
		retry := func(f func() error) error {
			for {
				err := f()
				if sqlState(err) != "40P01" {
					return err
				}
				workerDeadlocks.Add(1)
			}
		}
		for !stopped() {
			type run struct{ id, token int64 }
			var got []run
			err := retry(func() error {
				got = got[:0]
				rows, err := b.db.Pool.Query(ctx, `SELECT step_id, attempt
					FROM stepready.claim_and_start_steps(4, 'w', 60000, $1)`, at.Add(time.Minute))
				if err != nil {
					return err
				}
				defer rows.Close()
				for rows.Next() {
					var r run
					if err := rows.Scan(&r.id, &r.token); err != nil {
						return err
					}
					got = append(got, r)
				}
				return rows.Err()
			})
			if err != nil {
				errs <- fmt.Errorf("worker claim: %w", err)
				return
			}
			for _, r := range got {
				sql := `SELECT stepready.complete_step($1, $2, '{}', $3)::text`
				if rng.IntN(2) == 0 {
					sql = `SELECT state FROM stepready.fail_step($1, $2, '{"class": "permanent"}', $3, 0)`
				}
				if err := retry(func() error {
					_, err := b.db.Pool.Exec(ctx, sql, r.id, r.token, at.Add(time.Minute))
					return err
				}); err != nil {
					errs <- fmt.Errorf("worker: %s: %w", sql, err)
					return
				}
			}
		}
	}()

	// The operators finish their rounds; then the feed, the pruners and the worker stop.
	ops.Wait()
	close(stop)
	background.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("created %d tasks, pruned %d; %d worker calls chosen to break a deadlock and retried", created.Load(),
		pruned.Load(), workerDeadlocks.Load())
	require.Positive(t, pruned.Load())

	// Nothing lost: each task pruned whole or still there, consistent.
	left := b.intCall(`SELECT count(*)::int FROM stepready.tasks`)
	require.Equal(t, created.Load(), int64(left)+pruned.Load(), "every task is pruned or still there")
	require.Zero(t, b.intCall(`SELECT count(*)::int FROM stepready.step_events e
		WHERE NOT EXISTS (SELECT 1 FROM stepready.tasks t WHERE t.id = e.task_id)`), "no events of pruned tasks")
	require.Zero(t, b.intCall(`SELECT count(*)::int FROM stepready.tasks t
		WHERE t.steps_total <> (SELECT count(*) FROM stepready.steps s WHERE s.task_id = t.id)
		   OR t.steps_in_error <> (SELECT count(*) FROM stepready.steps s WHERE s.task_id = t.id AND s.state = 'error')
		   OR t.steps_unsatisfied <> (SELECT count(*) FROM stepready.steps s WHERE s.task_id = t.id
		                               AND NOT stepready._satisfies(s.state))`), "task counters match their steps")
	require.Empty(t, b.bookkeepingViolations(map[int64]time.Time{}, map[int64]string{}))
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	if err != nil {
		return "?"
	}
	return ""
}
