package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// RELIABILITY #4: every connection of the daemon is terminated while an attempt runs. The attempt's result is
// still recorded, once, as the outcome of that same attempt: the write retries on a new connection instead of
// being lost (which would leave the step to the reaper as `stalled` and charge a second attempt).
func TestResultIsRecordedAfterTheConnectionsDieMidAttempt(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			admin := b.db.Conn(t)
			b.reg.MustRegister("cut", steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
				var killed int
				err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE datname = current_database() AND application_name = $1`, daemonAppName).Scan(&killed)
				if err != nil {
					return nil, err
				}
				return map[string]int{"killed": killed}, nil
			}))
			// A long lease and reap interval: if the result were lost, the test would time out rather than
			// pass through a reap.
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: 500 * time.Millisecond,
				ReapInterval: time.Minute, Lease: 2 * time.Minute})
			id := b.createTask(t, `{"name": "cut", "steps": [{"name": "c", "handler": "cut"},
				{"name": "after", "handler": "noop", "depends_on": ["c"]}]}`)
			b.waitTask(t, id, 30*time.Second, "complete")

			var attempts, killed, started int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
				SELECT s.attempts, (s.output ->> 'killed')::int,
				       (SELECT count(*) FROM stepready.step_events e WHERE e.step_id = s.id AND e.event = 'attempt.started')
				  FROM stepready.steps s WHERE s.task_id = $1 AND s.name = 'c'`, id).Scan(&attempts, &killed, &started))
			require.Positive(t, killed, "the handler terminated the daemon's connections")
			require.Equal(t, 1, attempts, "the result of attempt 1 was recorded; no second attempt")
			require.Equal(t, 1, started)
		})
	}
}
