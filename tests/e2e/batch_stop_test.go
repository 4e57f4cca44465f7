package e2e

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// TestStopMidRunLosesNoBatchedOutcome stops a daemon in the middle of a run of many short steps, whose starts
// and completions go through the batchers: when Stop returns, every attempt that ran is recorded (complete, or
// released uncharged if it was cut short), none is left in flight, and a second daemon finishes the rest with
// every step completed exactly once.
func TestStopMidRunLosesNoBatchedOutcome(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			var ran atomic.Int64
			b.reg.MustRegister("short", steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
				ran.Add(1)
				select { // a few milliseconds, cut short by a shutdown
				case <-time.After(time.Duration(s.ID%5) * time.Millisecond):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return map[string]int64{"step": s.ID}, nil
			}))
			const tasks = 400
			_, err := b.db.Pool.Exec(ctx, `SELECT stepready.create_task(jsonb_build_object('name', 'short' || g,
				'steps', jsonb_build_array(jsonb_build_object('name', 's', 'handler', 'short'))))
				FROM generate_series(1, $1) g`, tasks)
			require.NoError(t, err)

			c, err := stepready.NewClient(b.pool, stepready.Config{Registry: b.reg, Dispatch: mode, Concurrency: 20,
				WorkerID: "first", PollInterval: time.Second, Logger: testLogger(t), ShutdownGrace: time.Second})
			require.NoError(t, err)
			require.NoError(t, c.Start(ctx))
			require.Eventually(t, func() bool { return ran.Load() >= tasks/4 }, 60*time.Second, time.Millisecond)
			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			require.NoError(t, c.Stop(stopCtx))

			// No attempt of the first daemon is left running, and what it completed it completed once. (With River
			// dispatch a claimed step whose job no worker took yet stays enqueued: its job waits in river_job for
			// any daemon.)
			var running, enqueued, complete, events int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM stepready.steps WHERE state = 'in_progress'),
				(SELECT count(*) FROM stepready.steps WHERE state = 'enqueued'),
				(SELECT count(*) FROM stepready.steps WHERE state = 'complete'),
				(SELECT count(*) FROM stepready.step_events WHERE event = 'step.completed')`).
				Scan(&running, &enqueued, &complete, &events))
			require.Zero(t, running, "every attempt of the stopped daemon is recorded")
			if mode == stepready.DispatchDirect {
				require.Zero(t, enqueued)
			} else {
				var orphans int
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps s
					WHERE s.state = 'enqueued' AND NOT EXISTS (SELECT 1 FROM river_job j
					 WHERE j.state = 'available' AND (j.args -> 'step' ->> 'step_id')::bigint = s.id)`).Scan(&orphans))
				require.Zero(t, orphans, "an enqueued step has its River job waiting")
			}
			require.Positive(t, complete)
			require.Equal(t, complete, events)
			var charged int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps
				WHERE state <> 'complete' AND attempts <> 0`).Scan(&charged))
			require.Zero(t, charged, "an attempt cut short by the shutdown is released uncharged")

			b.start(t, stepready.Config{Dispatch: mode, Concurrency: 20, WorkerID: "second", PollInterval: time.Second})
			require.Eventually(t, func() bool {
				var left int
				require.NoError(t, b.db.Pool.QueryRow(ctx,
					`SELECT count(*) FROM stepready.tasks WHERE status <> 'complete'`).Scan(&left))
				return left == 0
			}, 60*time.Second, 10*time.Millisecond)
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM stepready.steps WHERE state = 'complete' AND attempts = 1
				    AND output = jsonb_build_object('step', id)),
				(SELECT count(*) FROM stepready.step_events WHERE event = 'step.completed')`).Scan(&complete, &events))
			require.Equal(t, tasks, complete)
			require.Equal(t, tasks, events, "each step completed exactly once")
		})
	}
}
