package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// SIGTERM to a real `scheduler run` process while a step runs (RELIABILITY #5), in both dispatch modes: an
// attempt that ends within --shutdown-grace finishes and is recorded as it would have been without the signal
// (complete, attempts 1, no release); an attempt still running when the grace ends is cancelled and handed back
// uncharged. River dispatch used to cancel every running attempt the moment the signal arrived: River derives
// its jobs' contexts from the context its client starts with, which was the command's signal context.
func TestRunSIGTERMHonoursTheShutdownGrace(t *testing.T) {
	t.Parallel()
	for _, dispatch := range []string{"direct", "river"} {
		t.Run(dispatch, func(t *testing.T) {
			t.Parallel()
			t.Run("FinishesWithinTheGrace", func(t *testing.T) {
				t.Parallel()
				r := sigtermDuringStep(t, dispatch, 2000, "10s")
				require.Equal(t, "complete", r.state)
				require.Equal(t, 1, r.attempts)
				require.Equal(t, 0, r.released, "the attempt is not handed back")
				require.JSONEq(t, `{"slept_ms": 2000}`, r.output)
			})
			t.Run("ReleasedAfterTheGrace", func(t *testing.T) {
				t.Parallel()
				r := sigtermDuringStep(t, dispatch, 600_000, "1s")
				require.Equal(t, "pending", r.state, "ready again")
				require.Equal(t, 0, r.attempts, "uncharged")
				require.Equal(t, 1, r.released)
				require.GreaterOrEqual(t, r.stopped, time.Second, "the grace is waited out")
				require.Less(t, r.stopped, 30*time.Second)
			})
		})
	}
}

// sigtermResult is what a step came to after a SIGTERM of its daemon.
type sigtermResult struct {
	state    string
	attempts int
	released int
	output   string
	stopped  time.Duration // from the signal to the daemon's exit
}

// sigtermDuringStep runs a task of one `sleep` step of sleepMS in a `scheduler run` process with --shutdown-grace
// grace, sends SIGTERM as soon as the attempt runs, and returns what the step came to once the daemon exited
// (with status 0).
func sigtermDuringStep(t *testing.T, dispatch string, sleepMS int, grace string) sigtermResult {
	t.Helper()
	ctx := context.Background()
	db := pgtest.New(t)
	var taskID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, fmt.Sprintf(
		`{"name": "grace", "steps": [{"name": "s", "handler": "sleep", "input": {"ms": %d}}]}`, sleepMS)).Scan(&taskID))

	p := startScheduler(t, nil, "run", "--database-url", db.URL, "--dispatch", dispatch, "--shutdown-grace", grace,
		"--poll-interval", "200ms")
	waitFor(t, time.Minute, "the attempt runs", func() bool {
		state, _ := stepOfTask(t, db.Pool, taskID)
		return state == "in_progress"
	})
	signalled := time.Now()
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, time.Minute), "graceful exit; stderr:\n%s", p.stderr.String())
	r := sigtermResult{stopped: time.Since(signalled)}

	r.state, r.attempts = stepOfTask(t, db.Pool, taskID)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM stepready.step_events WHERE task_id = $1 AND event = 'step.released'),
			(SELECT coalesce(output::text, '') FROM stepready.steps WHERE task_id = $1)`, taskID).
		Scan(&r.released, &r.output))
	return r
}
