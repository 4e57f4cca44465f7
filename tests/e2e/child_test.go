package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// childEnv makes the test binary run as a daemon process: its value is the database URL.
const (
	childEnv         = "STEPREADY_E2E_CHILD_DATABASE_URL"
	childDispatchEnv = "STEPREADY_E2E_CHILD_DISPATCH"
	// childGraceEnv is the child's shutdown grace (a duration; default 200 ms).
	childGraceEnv = "STEPREADY_E2E_CHILD_GRACE"
	// childRunLogEnv names a file the "element" handler appends one line to for every run it finishes
	// ("INDEX ATTEMPT"), so a test can count handler runs across daemon processes, killed ones included.
	childRunLogEnv = "STEPREADY_E2E_CHILD_RUN_LOG"
)

// runChildDaemon is a real separate daemon: a "block" handler that runs until its context ends, the built-in
// handlers (`sleep`, `exec` allowed, …), a short lease, and graceful shutdown on SIGTERM. It starts its client
// with its signal context, as a program embedding stepready would (Example_embedTheDaemon): the signal must not
// reach the running attempts before the grace has passed.
func runChildDaemon() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(context.Background(), os.Getenv(childEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer pool.Close()
	reg := steps.NewRegistry()
	reg.MustRegister("block", steps.HandlerFunc(func(ctx context.Context, _ *steps.Step) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}))
	// A short piece of work (the crash test's steps).
	reg.MustRegister("work", steps.HandlerFunc(func(ctx context.Context, _ *steps.Step) (any, error) {
		select {
		case <-time.After(10 * time.Millisecond):
			return "done", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}))
	// A map element's work: a few milliseconds, then its index and item as output; every finished run is
	// logged to childRunLogEnv's file (O_APPEND, one write per line) before the result goes back.
	reg.MustRegister("element", steps.HandlerFunc(func(ctx context.Context, s *steps.Step) (any, error) {
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if path := os.Getenv(childRunLogEnv); path != "" {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
			if err != nil {
				return nil, fmt.Errorf("run log: %w", err)
			}
			_, err = fmt.Fprintf(f, "%d %d\n", s.Index, s.Attempt)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, fmt.Errorf("run log: %w", err)
			}
		}
		return map[string]any{"i": s.Index, "e": s.Element}, nil
	}))
	if err := builtin.Register(reg, builtin.Options{AllowExec: true}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	grace := 200 * time.Millisecond
	if s := os.Getenv(childGraceEnv); s != "" {
		if grace, err = time.ParseDuration(s); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: os.Getenv(childDispatchEnv),
		WorkerID: "child", Lease: 2 * time.Second, ReapInterval: time.Second, PollInterval: 200 * time.Millisecond,
		ShutdownGrace: grace})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	<-ctx.Done()
	if err := c.Stop(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startChild starts a daemon process (runChildDaemon) dispatching in mode, with env added to its environment.
func startChild(t *testing.T, b *bundle, mode string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+b.db.URL, childDispatchEnv+"="+mode), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd
}

// waitStep polls a step until cond holds on (state, attempts).
func (b *bundle) waitStep(t *testing.T, taskID int64, timeout time.Duration, what string, cond func(state string, attempts int) bool) (string, int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var state string
		var attempts int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT state, attempts FROM stepready.steps WHERE task_id = $1`, taskID).Scan(&state, &attempts))
		if cond(state, attempts) {
			return state, attempts
		}
		if time.Now().After(deadline) {
			t.Fatalf("step of task %d: %s not reached after %s (state %s, attempts %d)", taskID, what, timeout, state, attempts)
		}
		<-time.After(20 * time.Millisecond)
	}
}

// A worker process killed mid-attempt (SIGKILL: no release, no outcome) is reaped by another daemon and its
// step retried within lease + reap interval.
func TestKilledWorkerIsReapedAndRetried(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id := b.createTask(t, `{"name": "victim", "steps": [{"name": "s", "handler": "block",
				"retry": {"max_attempts": 3, "backoff": "fixed", "base_delay_ms": 0}}]}`)
			child := startChild(t, b, mode)
			b.waitStep(t, id, 30*time.Second, "running in the child", func(s string, _ int) bool { return s == "in_progress" })
			require.NoError(t, child.Process.Kill())
			_ = child.Wait()
			killedAt := time.Now()

			// A second daemon whose "block" handler succeeds at once.
			b.reg.MustRegister("block", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) { return "ok", nil }))
			b.start(t, stepready.Config{Dispatch: mode, Lease: 2 * time.Second, ReapInterval: time.Second,
				PollInterval: 200 * time.Millisecond})
			b.waitTask(t, id, 30*time.Second, "complete")
			// Lease 2 s + reap interval 1 s, with slack for a loaded machine.
			require.Less(t, time.Since(killedAt), 8*time.Second)

			var class string
			var attempts int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT
				(SELECT details ->> 'class' FROM stepready.step_events e JOIN stepready.steps s ON s.id = e.step_id
				  WHERE s.task_id = $1 AND e.event = 'attempt.failed' ORDER BY e.id LIMIT 1),
				(SELECT attempts FROM stepready.steps WHERE task_id = $1)`, id).Scan(&class, &attempts))
			require.Equal(t, "stalled", class)
			require.Equal(t, 2, attempts)
		})
	}
}

// SIGTERM while an attempt runs: the daemon cancels it after the grace period and hands it back uncharged
// (ready again, attempts unchanged), then exits 0.
func TestSIGTERMReleasesRunningAttemptsUncharged(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id := b.createTask(t, `{"name": "interrupted", "steps": [{"name": "s", "handler": "block"}]}`)
			child := startChild(t, b, mode)
			b.waitStep(t, id, 30*time.Second, "running in the child", func(s string, _ int) bool { return s == "in_progress" })
			require.NoError(t, child.Process.Signal(syscall.SIGTERM))
			require.NoError(t, child.Wait(), "graceful exit")

			state, attempts := b.waitStep(t, id, 5*time.Second, "released", func(s string, _ int) bool { return s == "pending" })
			require.Equal(t, "pending", state)
			require.Equal(t, 0, attempts, "the released attempt is not charged")
			var released int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM stepready.step_events e
				JOIN stepready.steps s ON s.id = e.step_id WHERE s.task_id = $1 AND e.event = 'step.released'`, id).Scan(&released))
			require.Equal(t, 1, released)
		})
	}
}

// SIGTERM to a daemon process that started its client with its signal context, in both dispatch modes: an
// attempt that ends within the shutdown grace finishes and is recorded (complete, attempts 1, no release); one
// still running when the grace ends is released uncharged (RELIABILITY #5). River dispatch used to cancel every
// running attempt at the signal: River derived its jobs' contexts from the context given to Start.
func TestSIGTERMHonoursTheShutdownGrace(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		for _, tc := range []struct {
			name    string
			sleepMS int
			grace   string
		}{{"FinishesWithinTheGrace", 2000, "10s"}, {"ReleasedAfterTheGrace", 600_000, "1s"}} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				id := b.createTask(t, fmt.Sprintf(`{"name": "grace", "steps": [{"name": "s", "handler": "sleep",
					"input": {"ms": %d}}]}`, tc.sleepMS))
				child := startChild(t, b, mode, childGraceEnv+"="+tc.grace)
				b.waitStep(t, id, 30*time.Second, "running in the child", func(s string, _ int) bool { return s == "in_progress" })
				require.NoError(t, child.Process.Signal(syscall.SIGTERM))
				require.NoError(t, child.Wait(), "graceful exit")

				state, attempts := b.waitStep(t, id, 5*time.Second, "settled", func(string, int) bool { return true })
				var released int
				require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM stepready.step_events
					WHERE task_id = $1 AND event = 'step.released'`, id).Scan(&released))
				if tc.sleepMS < 10_000 {
					require.Equal(t, "complete", state, "the attempt finished within the grace")
					require.Equal(t, 1, attempts)
					require.Zero(t, released)
				} else {
					require.Equal(t, "pending", state, "released")
					require.Equal(t, 0, attempts, "uncharged")
					require.Equal(t, 1, released)
				}
			})
		}
	}
}

// Cancelling the context given to Client.Start, once started, cancels nothing, in both dispatch modes: the
// running attempt is not cancelled and the client goes on claiming; only Stop stops it.
func TestCancellingTheStartContextCancelsNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			running := make(chan struct{}, 1)
			cause := make(chan error, 1)
			b.reg.MustRegister("gate", steps.HandlerFunc(func(ctx context.Context, _ *steps.Step) (any, error) {
				select {
				case running <- struct{}{}:
				default:
				}
				// A second is ample for a cancellation to arrive (it took microseconds when it did).
				select {
				case <-ctx.Done():
					cause <- context.Cause(ctx)
					return nil, ctx.Err()
				case <-time.After(time.Second):
					cause <- nil
					return "ok", nil
				}
			}))
			c, err := stepready.NewClient(b.pool, stepready.Config{Registry: b.reg, Dispatch: mode,
				PollInterval: 200 * time.Millisecond, Logger: testLogger(t)})
			require.NoError(t, err)
			startCtx, cancel := context.WithCancel(context.Background())
			require.NoError(t, c.Start(startCtx))
			t.Cleanup(func() { require.NoError(t, c.Stop(context.Background())) })

			first := b.createTask(t, `{"name": "first", "steps": [{"name": "s", "handler": "gate"}]}`)
			<-running
			cancel()
			require.NoError(t, <-cause, "the running attempt's context was cancelled")
			b.waitTask(t, first, 30*time.Second, "complete")
			second := b.createTask(t, `{"name": "second", "steps": [{"name": "s", "handler": "noop"}]}`)
			b.waitTask(t, second, 30*time.Second, "complete")
		})
	}
}
