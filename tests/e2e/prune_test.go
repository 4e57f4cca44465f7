package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
)

// TestDaemonPrunesFinishedTasks: a daemon with a short retention deletes the tasks it finished on its own, in
// both dispatch modes, and leaves the unfinished ones (SPEC §13).
func TestDaemonPrunesFinishedTasks(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			done := b.createTask(t, `{"name": "done", "steps": [{"name": "a", "handler": "noop"},
				{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`)
			waiting := b.createTask(t, `{"name": "waiting", "run_at": "2100-01-01T00:00:00Z",
				"steps": [{"name": "a", "handler": "noop"}]}`)
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: 100 * time.Millisecond,
				RetentionComplete: time.Millisecond, RetentionFailed: stepready.KeepForever,
				PruneInterval: 50 * time.Millisecond})

			deadline := time.Now().Add(20 * time.Second)
			for {
				var n int
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks WHERE id = $1`, done).Scan(&n))
				if n == 0 {
					break
				}
				require.True(t, time.Now().Before(deadline), "task %d was not pruned", done)
				<-time.After(20 * time.Millisecond)
			}
			var steps, events, left int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM stepready.steps WHERE task_id = $1),
				(SELECT count(*) FROM stepready.step_events WHERE task_id = $1),
				(SELECT count(*) FROM stepready.tasks WHERE id = $2)`, done, waiting).Scan(&steps, &events, &left))
			require.Zero(t, steps)
			require.Zero(t, events)
			require.Equal(t, 1, left, "an unfinished task is never pruned")
		})
	}
}
