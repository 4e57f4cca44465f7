package e2e

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// With the poll interval at ten minutes, only a wake-up can start work soon: a child starts within
// milliseconds of its parent completing, and a new task within milliseconds of its creation. Writing transactions
// send no NOTIFY (sql/045_notify.sql): a task created by plain SQL is found by the probe of the wake-up counter
// (with or without LISTEN), one created by the library is announced by its NOTIFY after the commit (even with the
// probe off). Without either, the task waits for the poll: the last case checks that the bound is the wake-up's.
// Before schema version 21 the probe did not exist: "plain SQL, poll only" waited for the ten-minute poll.
func TestWakeUpsStartWorkWithinMilliseconds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		pollOnly bool
		probe    time.Duration
		library  bool // create with stepready.CreateTask (wakes after its commit) instead of plain SQL
		started  bool // the task starts within the bound
	}{
		{"plain SQL, LISTEN and probe", false, 0, false, true},
		{"plain SQL, poll only: the probe", true, 0, false, true},
		{"library, probe off: its NOTIFY after commit", false, stepready.Off, true, true},
		{"plain SQL, probe off, poll only: nothing wakes the daemon", true, stepready.Off, false, false},
	}
	for _, mode := range dispatchModes {
		for _, tc := range cases {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				if !tc.started && mode != stepready.DispatchDirect {
					// The same poller in both modes; only the direct mode's claim connection shows when its
					// first claim is over (River's ends on a COMMIT like River's own transactions).
					t.Skip("checked in direct mode")
				}
				b := setup(t)
				b.start(t, stepready.Config{Dispatch: mode, PollInterval: 10 * time.Minute, ReapInterval: time.Second,
					PollOnly: tc.pollOnly, ProbeInterval: tc.probe})
				create := func(def string) int64 {
					if !tc.library {
						return b.createTask(t, def)
					}
					id, err := stepready.CreateTask(context.Background(), b.db.Pool, json.RawMessage(def))
					require.NoError(t, err)
					return id
				}
				// The claim round at start must be over (else it, not a wake-up, could start the task): some
				// connection of the daemon's has run a claim (read in direct mode; in River's the bounds hold
				// all the same when the task is claimed at start).
				require.Eventually(t, func() bool {
					if mode != stepready.DispatchDirect {
						return true
					}
					var n int
					require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
						WHERE application_name = $1 AND query ~ 'next_flow_at|next_claim_at|wake_count' AND state = 'idle'`,
						daemonAppName).Scan(&n))
					return n > 0
				}, 20*time.Second, 10*time.Millisecond, "the daemon's first claim")
				id := create(`{"name": "chain", "steps": [
					{"name": "parent", "handler": "noop"},
					{"name": "child", "handler": "noop", "depends_on": ["parent"]}]}`)
				if !tc.started {
					// Generous for a loaded machine, far below the ten-minute poll.
					require.Never(t, func() bool {
						var status string
						require.NoError(t, b.db.Pool.QueryRow(context.Background(),
							`SELECT status FROM stepready.tasks WHERE id = $1`, id).Scan(&status))
						return status != "pending"
					}, 3*time.Second, 50*time.Millisecond, "nothing should wake the daemon")
					return
				}
				b.waitTask(t, id, 20*time.Second, "complete")
				var createToStart, parentToChild time.Duration
				require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
					SELECT (SELECT min(e.at) FROM stepready.step_events e JOIN stepready.steps s ON s.id = e.step_id
					         WHERE s.task_id = $1 AND s.name = 'parent' AND e.event = 'attempt.started') - t.created_at,
					       (SELECT min(e.at) FROM stepready.step_events e JOIN stepready.steps s ON s.id = e.step_id
					         WHERE s.task_id = $1 AND s.name = 'child' AND e.event = 'attempt.started')
					     - (SELECT max(e.at) FROM stepready.step_events e JOIN stepready.steps s ON s.id = e.step_id
					         WHERE s.task_id = $1 AND s.name = 'parent' AND e.event = 'step.completed')
					  FROM stepready.tasks t WHERE t.id = $1`, id).Scan(&createToStart, &parentToChild))
				// Generous bounds for a loaded CI machine under -race; the point is "not the 10 minute poll".
				require.Less(t, createToStart, 2*time.Second)
				require.Less(t, parentToChild, 2*time.Second)
			})
		}
	}
}

// Two daemons on one database run 1,000 steps: every (step, attempt) starts exactly once and every step
// completes once.
func TestTwoDaemonsStartEveryAttemptOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var mu sync.Mutex
			runs := map[[2]int64]int{}
			b.reg.MustRegister("count", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
				mu.Lock()
				runs[[2]int64{s.ID, int64(s.Attempt)}]++
				mu.Unlock()
				return nil, nil
			}))
			for i := range 2 {
				b.start(t, stepready.Config{Dispatch: mode, Concurrency: 20, WorkerID: []string{"w1", "w2"}[i],
					PollInterval: time.Second, ReapInterval: time.Second})
			}
			var ids []int64
			for range 10 {
				def := `{"name": "bulk", "steps": [`
				for j := range 100 {
					if j > 0 {
						def += ","
					}
					def += `{"name": "s` + string(rune('a'+j/26)) + string(rune('a'+j%26)) + `", "handler": "count"}`
				}
				ids = append(ids, b.createTask(t, def+`]}`))
			}
			for _, id := range ids {
				b.waitTask(t, id, 60*time.Second, "complete")
			}
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, runs, 1000)
			for k, n := range runs {
				require.Equal(t, 1, n, "step %d attempt %d ran %d times", k[0], k[1], n)
			}
			var started, completed int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT
				count(*) FILTER (WHERE event = 'attempt.started'), count(*) FILTER (WHERE event = 'step.completed')
				FROM stepready.step_events`).Scan(&started, &completed))
			require.Equal(t, 1000, started)
			require.Equal(t, 1000, completed)
			var workers int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT details ->> 'worker')
				FROM stepready.step_events WHERE event = 'attempt.started'`).Scan(&workers))
			require.Equal(t, 2, workers, "both daemons did work")
		})
	}
}

// The daemon survives pg_terminate_backend of all its connections: the listener reconnects, the pool replaces
// its connections, and work goes on.
func TestDaemonSurvivesTerminatedConnections(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: 500 * time.Millisecond, ReapInterval: time.Second})
			id := b.createTask(t, `{"name": "before", "steps": [{"name": "a", "handler": "noop"}]}`)
			b.waitTask(t, id, 20*time.Second, "complete")

			admin := b.db.Conn(t)
			var killed int
			require.NoError(t, admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid))
				FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, daemonAppName).Scan(&killed))
			require.Positive(t, killed)

			id = b.createTask(t, `{"name": "after", "steps": [{"name": "a", "handler": "noop"},
				{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`)
			b.waitTask(t, id, 30*time.Second, "complete")
		})
	}
}
