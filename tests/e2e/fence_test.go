package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// run is one run of a handler, as the handler saw it.
type run struct {
	step       string
	n          int // 1-based run of this step
	attempt    int
	start, end time.Time
	cancelled  time.Time // when its context ended (zero: it did not)
	slots      int       // the key's slots taken in the database while it cleaned up after its context ended
}

// TestOperatorActionDuringAnAttempt (issue 27, findings 2 and 6), both dispatch modes: an operator cancels,
// resolves, or cancels and resets the task of a step whose handler runs, on a concurrency key of limit 1 with
// another task's step waiting. The running handler learns it at its next heartbeat (its context is cancelled,
// within a third of the lease and a little), and while it still runs (here: cleans up for 150 ms) the database
// still counts its slot taken: the waiting step starts only after the handler returned, and a reset step's
// second run only after its first. The old run's result is never recorded. Before schema version 9 the waiting
// step started right after the operator's action (two handlers of a key of limit 1 at once), and after a reset
// the old run's heartbeats and result passed for the new run's.
func TestOperatorActionDuringAnAttempt(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	actions := []struct {
		name string
		act  func(b *bundle, t *testing.T, taskID int64)
		// want is the status of the acted-on task at the end, and its step's output
		want, output string
	}{
		{"cancel", func(b *bundle, t *testing.T, taskID int64) {
			_, err := b.db.Pool.Exec(context.Background(), `SELECT stepready.cancel_task($1, 'e2e')`, taskID)
			require.NoError(t, err)
		}, "cancelled", ""},
		{"resolve", func(b *bundle, t *testing.T, taskID int64) {
			_, err := b.db.Pool.Exec(context.Background(), `SELECT stepready.resolve_step(s.id, '{"by": "hand"}')
				FROM stepready.steps s WHERE s.task_id = $1`, taskID)
			require.NoError(t, err)
		}, "complete", `{"by": "hand"}`},
		{"cancel + reset", func(b *bundle, t *testing.T, taskID int64) {
			_, err := b.db.Pool.Exec(context.Background(), `SELECT stepready.cancel_task($1, 'e2e')`, taskID)
			require.NoError(t, err)
			_, err = b.db.Pool.Exec(context.Background(), `SELECT stepready.reset_task($1)`, taskID)
			require.NoError(t, err)
		}, "complete", `{"step": "a", "run": 2}`},
	}
	for _, mode := range dispatchModes {
		for _, action := range actions {
			t.Run(mode+"/"+action.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				var mu sync.Mutex
				var runs []*run
				running, maxRunning := 0, 0
				started := make(chan struct{}, 4)
				b.reg.MustRegister("hold", steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
					r := &run{step: s.Name, attempt: s.Attempt, start: time.Now()}
					mu.Lock()
					for _, o := range runs {
						if o.step == s.Name {
							r.n = max(r.n, o.n)
						}
					}
					r.n++
					runs = append(runs, r)
					running++
					maxRunning = max(maxRunning, running)
					first := s.Name == "a" && r.n == 1
					mu.Unlock()
					defer func() {
						mu.Lock()
						running--
						r.end = time.Now()
						mu.Unlock()
					}()
					started <- struct{}{}
					if !first {
						return map[string]any{"step": s.Name, "run": r.n}, nil
					}
					// The first run of a holds on until its context ends, then cleans up for a while: its slot must
					// stay taken all along.
					<-ctx.Done()
					mu.Lock()
					r.cancelled = time.Now()
					mu.Unlock()
					var slots int
					if err := b.db.Pool.QueryRow(context.Background(),
						`SELECT stepready._flow_in_flight('k', now())`).Scan(&slots); err != nil {
						return nil, err
					}
					// The handler's own clean-up work, 150 ms long, during which the slot must stay taken (the
					// test measures the slot over that time; it waits for no state).
					<-time.After(150 * time.Millisecond)
					mu.Lock()
					r.slots = slots
					mu.Unlock()
					return map[string]any{"step": s.Name, "run": r.n, "late": true}, nil
				}))
				b.start(t, stepready.Config{Dispatch: mode, Lease: lease, ReapInterval: lease / 3,
					PollInterval: 50 * time.Millisecond, Concurrency: 4})

				def := `{"name": %q, "concurrency": {"key": "k", "limit": 1},
					"steps": [{"name": %q, "handler": "hold"}]}`
				a := b.createTask(t, fmt.Sprintf(def, "A", "a"))
				<-started
				b.waitStepState(t, a, 10*time.Second, "in_progress")
				other := b.createTask(t, fmt.Sprintf(def, "B", "b"))

				acted := time.Now()
				action.act(b, t, a)
				b.waitTask(t, other, 20*time.Second, "complete")
				b.waitTask(t, a, 20*time.Second, action.want)
				// Every handler has returned (the cancelled one too: a cancelled task is cancelled at once).
				deadline := time.Now().Add(20 * time.Second)
				for {
					mu.Lock()
					done := running == 0 && len(runs) > 0 && !runs[0].end.IsZero()
					mu.Unlock()
					if done {
						break
					}
					require.True(t, time.Now().Before(deadline), "handlers still running")
					<-time.After(10 * time.Millisecond)
				}

				mu.Lock()
				defer mu.Unlock()
				var first, secondA, onB *run
				for _, r := range runs {
					switch {
					case r.step == "a" && r.n == 1:
						first = r
					case r.step == "a":
						secondA = r
					default:
						onB = r
					}
				}
				require.NotNil(t, first)
				require.NotNil(t, onB)
				t.Logf("after the action: old run's context ended at +%s, returned at +%s; other step started at +%s",
					first.cancelled.Sub(acted), first.end.Sub(acted), onB.start.Sub(acted))
				require.False(t, first.cancelled.IsZero(), "the cancelled run's context ended")
				require.Less(t, first.cancelled.Sub(acted), lease, "it learnt at its next heartbeat (every lease/3)")
				require.Equal(t, 1, first.slots, "while it cleaned up, its slot was still taken")
				require.Equal(t, 1, maxRunning, "never two handlers at once on a key of limit 1")
				require.True(t, onB.start.After(first.end), "the other task's step started after the old run returned "+
					"(%s before)", first.end.Sub(onB.start))
				if action.name == "cancel + reset" {
					require.NotNil(t, secondA, "the reset step ran again")
					require.True(t, secondA.start.After(first.end), "its second run started after its first returned")
					require.Equal(t, 1, secondA.attempt, "attempt 1 again after the reset")
				} else {
					require.Nil(t, secondA)
				}

				var output *string
				require.NoError(t, b.db.Pool.QueryRow(context.Background(),
					`SELECT output::text FROM stepready.steps WHERE task_id = $1`, a).Scan(&output))
				if action.output == "" {
					require.Nil(t, output, "the old run's result is not recorded")
				} else {
					require.NotNil(t, output)
					require.JSONEq(t, action.output, *output, "the old run's result is not recorded")
					var doc map[string]any
					require.NoError(t, json.Unmarshal([]byte(*output), &doc))
					require.NotContains(t, doc, "late")
				}
				var leased int
				require.NoError(t, b.db.Pool.QueryRow(context.Background(),
					`SELECT count(*)::int FROM stepready.steps WHERE lease_expires_at IS NOT NULL`).Scan(&leased))
				require.Zero(t, leased, "the old run's report ended its lease")
			})
		}
	}
}

// waitStepState polls until every step of the task is in state want or the deadline passes.
func (b *bundle) waitStepState(t *testing.T, taskID int64, timeout time.Duration, want string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT count(*)::int FROM stepready.steps WHERE task_id = $1 AND state <> $2`, taskID, want).Scan(&n))
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %d: steps not all %s after %s", taskID, want, timeout)
		}
		<-time.After(10 * time.Millisecond)
	}
}
