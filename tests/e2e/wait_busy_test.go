package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// A durable sleep ends on time while every worker slot of the only daemon is busy: the due timer still runs a
// claim of zero steps, whose prologue ends the due waits. The poll interval is ten minutes, so nothing else could
// end the sleep; before the poller did this, the sleep waited for a slot to free (here: never).
func TestSleepEndsWhileEveryWorkerSlotIsBusy(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			release := make(chan struct{})
			started := make(chan struct{}, 1)
			b.reg.MustRegister("block", steps.HandlerFunc(func(ctx context.Context, _ *steps.Step) (any, error) {
				select {
				case started <- struct{}{}:
				default:
				}
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil, nil
			}))
			b.start(t, stepready.Config{Dispatch: mode, Concurrency: 1, PollInterval: 10 * time.Minute,
				ReapInterval: time.Second})
			t.Cleanup(func() { close(release) }) // runs before the client's Stop (cleanups run last-in first-out)

			busy := b.createTask(t, `{"name": "busy", "steps": [{"name": "b", "handler": "block"}]}`)
			select {
			case <-started:
			case <-time.After(20 * time.Second):
				t.Fatal("the blocking step never started")
			}
			sleeper := b.createTask(t, `{"name": "sleeper", "steps": [{"name": "nap", "wait": {"duration_ms": 300}}]}`)
			b.waitTask(t, sleeper, 20*time.Second, "complete")

			var status string
			require.NoError(t, b.db.Pool.QueryRow(context.Background(),
				`SELECT status FROM stepready.tasks WHERE id = $1`, busy).Scan(&status))
			require.Equal(t, "in_progress", status, "the only worker slot was busy all along")
		})
	}
}
