package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/python"
	"github.com/stepready/stepready/steps"
)

// pythonBenchConcurrency is the concurrency of both workers of scenario 12: the Python worker runs a thread per
// attempt, so its concurrency is sized as a Python deployment would size it, and the Go daemon gets the same.
const pythonBenchConcurrency = 100

// pythonWorker is scenario 12 (issue 23): no-op steps per second of the Python reference worker (workers/python,
// a process of its own) against the Go daemon (stepready.Client, direct dispatch) at the same concurrency, each
// working size.PythonSteps one-step tasks loaded beforehand. Context for choosing a worker, no target. Both rates
// are measured on the database's clock, from the first attempt's start to the last completion, so the Python
// interpreter's start is not counted. Medians of repeatRuns interleaved runs.
func pythonWorker(ctx context.Context, env *Env, size Size) ([]Row, error) {
	py, err := python.Find("psycopg")
	if err != nil {
		return nil, err
	}
	n := size.PythonSteps
	got, err := medians(
		func() (float64, error) { return throughputPython(ctx, env, py, n) },
		func() (float64, error) { return throughputGoAt(ctx, env, n, pythonBenchConcurrency) },
	)
	if err != nil {
		return nil, err
	}
	conc := fmt.Sprintf("concurrency %d, %d no-op steps", pythonBenchConcurrency, n)
	return []Row{
		{Scenario: "12 python worker", Figure: "Python worker (psycopg 3, threads)" + env.Options.label() + ", " + conc,
			Value: got[0], Unit: "steps/s", Baseline: "Go daemon, direct dispatch, same concurrency", BaseVal: got[1],
			Ratio: got[0] / got[1], Target: "context (no target)"},
		{Scenario: "12 python worker", Figure: "Go daemon, direct dispatch" + env.Options.label() + ", " + conc,
			Value: got[1], Unit: "steps/s", Target: "context (no target)"},
	}, nil
}

// throughputPython works n loaded no-op steps with the Python worker as a process and returns its rate.
func throughputPython(ctx context.Context, env *Env, py string, n int) (float64, error) {
	pool, url, err := env.NewDB(ctx, 4)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadIndependent(ctx, pool, n); err != nil {
		return 0, err
	}
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.CommandContext(ctx, py, "-m", "stepready_worker", "--builtins")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(filepath.Dir(file), "..", "..", "workers", "python"),
		"STEPREADY_DATABASE_URL="+url, "STEPREADY_CONCURRENCY="+strconv.Itoa(pythonBenchConcurrency),
		"STEPREADY_POLL_INTERVAL=1s", "STEPREADY_LOG_LEVEL=warn", "STEPREADY_POLL_ONLY="+strconv.FormatBool(env.Options.PollOnly))
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start the Python worker: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	err = waitTasks(ctx, pool, n, 10*time.Minute, exited)
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	if err != nil {
		return 0, fmt.Errorf("python worker: %w; its log:\n%s", err, logs.String())
	}
	return rateOnDatabaseClock(ctx, pool, n)
}

// throughputGoAt works n loaded no-op steps with a Client of the given concurrency (direct dispatch) and returns
// its rate.
func throughputGoAt(ctx context.Context, env *Env, n, concurrency int) (float64, error) {
	pool, _, err := env.NewDB(ctx, concurrency+5)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadIndependent(ctx, pool, n); err != nil {
		return 0, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: stepready.DispatchDirect,
		Concurrency: concurrency, PollInterval: time.Second, PollOnly: env.Options.PollOnly,
		Logger: env.Logger.With("component", "client")})
	if err != nil {
		return 0, err
	}
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	err = waitTasks(ctx, pool, n, 10*time.Minute, nil)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if stopErr := c.Stop(stopCtx); err == nil && stopErr != nil {
		err = fmt.Errorf("stop client: %w", stopErr)
	}
	if err != nil {
		return 0, err
	}
	return rateOnDatabaseClock(ctx, pool, n)
}

// rateOnDatabaseClock is n steps over the time from the first attempt's start to the last completion, as the
// database recorded them.
func rateOnDatabaseClock(ctx context.Context, pool *pgxpool.Pool, n int) (float64, error) {
	var seconds float64
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM (SELECT max(completed_at) FROM stepready.steps)
		- (SELECT min(at) FROM stepready.step_events WHERE event = 'attempt.started'))::float8`).Scan(&seconds); err != nil {
		return 0, err
	}
	if seconds <= 0 {
		return 0, fmt.Errorf("bench: no time elapsed between the first start and the last completion")
	}
	return float64(n) / seconds, nil
}
