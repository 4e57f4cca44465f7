package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// A flaky step's retries happen when its policy says: each retry.scheduled event's next_attempt_at is the
// failure time plus backoff_delay_ms of that attempt (database time), and the next attempt starts no earlier.
func TestFlakyStepRetriesOnItsPolicySchedule(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.reg.MustRegister("flaky", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
				if s.Attempt <= 2 {
					return nil, steps.Fail(steps.ClassTransient, fmt.Errorf("attempt %d fails", s.Attempt))
				}
				return map[string]int{"attempts": s.Attempt}, nil
			}))
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute, ReapInterval: time.Second})
			id := b.createTask(t, `{"name": "flaky", "steps": [{"name": "f", "handler": "flaky",
				"retry": {"backoff": "exponential", "base_delay_ms": 150, "multiplier": 2, "max_attempts": 3}}]}`)
			b.waitTask(t, id, 20*time.Second, "complete")

			rows, err := b.db.Pool.Query(context.Background(), `
				SELECT f.attempt, f.at, (f.details ->> 'next_attempt_at')::timestamptz,
				       stepready.backoff_delay_ms('exponential', f.attempt, 150, 2, 30000),
				       (SELECT min(s.at) FROM stepready.step_events s
				         WHERE s.step_id = f.step_id AND s.event = 'attempt.started' AND s.attempt = f.attempt + 1)
				  FROM stepready.step_events f
				  JOIN stepready.steps st ON st.id = f.step_id
				 WHERE st.task_id = $1 AND f.event = 'retry.scheduled'
				 ORDER BY f.id`, id)
			require.NoError(t, err)
			n := 0
			for rows.Next() {
				var attempt int
				var failedAt, nextAt, startedAt time.Time
				var delayMS int64
				require.NoError(t, rows.Scan(&attempt, &failedAt, &nextAt, &delayMS, &startedAt))
				n++
				require.Equal(t, n, attempt)
				require.Equal(t, failedAt.Add(time.Duration(delayMS)*time.Millisecond), nextAt,
					"attempt %d: next_attempt_at = failure + backoff_delay_ms", attempt)
				require.False(t, startedAt.Before(nextAt), "attempt %d started at %s before %s", attempt+1, startedAt, nextAt)
				// Woken by the due timer, not the (one minute) poll: the retry starts promptly.
				require.Less(t, startedAt.Sub(nextAt), 2*time.Second)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, 2, n)
		})
	}
}

// A handler panic is a recorded failure; a step of a handler the daemon lacks is not claimed (work routing): it
// stays ready and explain names the handler it waits for; the daemon keeps working other steps.
func TestPoisonStepsAreContained(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.reg.MustRegister("panics", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
				panic("boom")
			}))
			b.reg.MustRegister("always_fails", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
				return nil, errors.New("nope")
			}))
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute, ReapInterval: time.Second})
			panicTask := b.createTask(t, `{"name": "p", "steps": [{"name": "p", "handler": "panics"}]}`)
			unknownTask := b.createTask(t, `{"name": "u", "steps": [{"name": "u", "handler": "no_such_handler"}]}`)
			failTask := b.createTask(t, `{"name": "f", "steps": [{"name": "f", "handler": "always_fails",
				"retry": {"max_attempts": 3, "backoff": "fixed", "base_delay_ms": 10}},
				{"name": "sibling", "handler": "noop"}]}`)
			okTask := b.createTask(t, `{"name": "ok", "steps": [{"name": "ok", "handler": "noop"}]}`)

			b.waitTask(t, okTask, 20*time.Second, "complete")
			for _, id := range []int64{panicTask, failTask} {
				b.waitTask(t, id, 20*time.Second, "error")
			}
			var class, msg, stack string
			var attempts int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT last_error ->> 'class',
				last_error ->> 'message', COALESCE(last_error ->> 'stack', ''), attempts
				FROM stepready.steps WHERE task_id = $1`, panicTask).Scan(&class, &msg, &stack, &attempts))
			require.Equal(t, "permanent", class)
			require.Contains(t, msg, "boom")
			require.Contains(t, stack, "goroutine")
			require.Equal(t, 1, attempts)

			// The unknown handler's step was never claimed (the daemon has claimed since: the other tasks ended).
			var state string
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT state, attempts
				FROM stepready.steps WHERE task_id = $1`, unknownTask).Scan(&state, &attempts))
			require.Equal(t, "pending", state)
			require.Zero(t, attempts)
			var reason string
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT reason, message
				FROM stepready.explain_task($1)`, unknownTask).Scan(&reason, &msg))
			require.Equal(t, "waiting_for_worker", reason)
			require.Contains(t, msg, "has handler no_such_handler")

			// The always-failing step ends after exactly max_attempts; its sibling still completed.
			var sibling string
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT
				(SELECT attempts FROM stepready.steps WHERE task_id = $1 AND name = 'f'),
				(SELECT state FROM stepready.steps WHERE task_id = $1 AND name = 'sibling')`, failTask).
				Scan(&attempts, &sibling))
			require.Equal(t, 3, attempts)
			require.Equal(t, "complete", sibling)
		})
	}
}
