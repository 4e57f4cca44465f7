package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/pgcluster"
	"github.com/stepready/stepready/migrations"
	"github.com/stepready/stepready/steps"
)

// libfaketimePaths are where distributions install libfaketime (Debian and Ubuntu: package libfaketime).
var libfaketimePaths = []string{
	"/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
	"/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
	"/usr/lib/faketime/libfaketimeMT.so.1",
	"/usr/local/lib/faketime/libfaketimeMT.so.1",
}

func findLibfaketime() string {
	for _, p := range libfaketimePaths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// RELIABILITY #7, "time is the database's": the daemon's clock and the database's disagree by an hour, in both
// directions, and nothing changes. PostgreSQL runs under libfaketime (its clock shifted); the Go process keeps the
// real one (Go reads the clock without libc, so the preload does not reach it). If any readiness decision, backoff
// or wake-up timer used the daemon's clock, the retries below would run an hour early (at once) or an hour late
// (never, within the test). CI installs libfaketime (.ci/run); elsewhere the test is skipped without it.
func TestAnHourOfClockSkewChangesNothing(t *testing.T) {
	t.Parallel()
	lib := findLibfaketime()
	if lib == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("libfaketime is not installed: .ci/run installs package libfaketime for this test")
		}
		t.Skip("libfaketime is not installed (apt-get install libfaketime)")
	}
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprintf("database clock %+v", skew), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cl, err := pgcluster.StartThrowaway(ctx, pgcluster.ThrowawayOptions{
				Settings: pgcluster.FastSettings,
				Env:      []string{"LD_PRELOAD=" + lib, fmt.Sprintf("FAKETIME=%+dh", int(skew.Hours()))},
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = cl.Stop(context.Background()) })
			require.NoError(t, migrations.Up(ctx, cl.URL, nil))
			pcfg, err := pgxpool.ParseConfig(cl.URL)
			require.NoError(t, err)
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)

			// The skew is real: the database's now() is an hour away from this process's clock.
			var dbNow time.Time
			require.NoError(t, pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow))
			require.InDelta(t, skew.Seconds(), time.Until(dbNow).Seconds(), 60)

			for _, mode := range dispatchModes {
				skewRun(t, pool, mode)
			}
		})
	}
}

// skewRun runs a two-step task whose first step fails twice (exponential backoff from 150 ms) under one
// dispatch mode, with a one-minute poll so only the due timer and LISTEN/NOTIFY wake the daemon, and checks the
// retry schedule in database time.
func skewRun(t *testing.T, pool *pgxpool.Pool, mode string) {
	ctx := context.Background()
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	reg.MustRegister("flaky", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		if s.Attempt <= 2 {
			return nil, steps.Fail(steps.ClassTransient, fmt.Errorf("attempt %d fails", s.Attempt))
		}
		return nil, nil
	}))
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: mode, Logger: testLogger(t),
		PollInterval: time.Minute, ReapInterval: time.Second})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, c.Stop(stopCtx))
	}()

	var id int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT stepready.create_task($1)`, `{"name": "skew", "steps": [
		{"name": "f", "handler": "flaky",
		 "retry": {"backoff": "exponential", "base_delay_ms": 150, "multiplier": 2, "max_attempts": 3}},
		{"name": "after", "handler": "noop", "depends_on": ["f"]}]}`).Scan(&id))

	deadline := time.Now().Add(20 * time.Second)
	for {
		var status string
		require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM stepready.tasks WHERE id = $1`, id).Scan(&status))
		if status == "complete" {
			break
		}
		require.NotEqual(t, "error", status, "%s: task ended in error", mode)
		if time.Now().After(deadline) {
			t.Fatalf("%s: task %d is %s after 20s: a decision used the daemon's clock", mode, id, status)
		}
		<-time.After(10 * time.Millisecond)
	}

	// Each retry started no earlier than its next_attempt_at = failure + backoff (database time), and promptly.
	rows, err := pool.Query(ctx, `
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
		require.Equal(t, failedAt.Add(time.Duration(delayMS)*time.Millisecond), nextAt, "%s: attempt %d", mode, attempt)
		require.False(t, startedAt.Before(nextAt), "%s: attempt %d started at %s, before %s", mode, attempt+1,
			startedAt, nextAt)
		require.Less(t, startedAt.Sub(nextAt), 2*time.Second, "%s: attempt %d started late", mode, attempt+1)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 2, n, "%s: two retries", mode)
}
