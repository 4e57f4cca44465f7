package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

const (
	// stormFailures is how many attempts of each retry-storm step fail before one succeeds.
	stormFailures = 2
	// stormBackoff is the fixed backoff between those attempts.
	stormBackoff = 10 * time.Millisecond
)

// errPlanned is the failure of the retry storm's handler.
var errPlanned = errors.New("bench: planned failure")

// loadStorm creates n one-step tasks whose step runs the `flaky` handler with a fixed backoff of stormBackoff
// and exactly enough attempts to succeed (stormFailures + 1), without jitter.
func loadStorm(ctx context.Context, pool *pgxpool.Pool, n int) error {
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'storm' FROM generate_series(1, %d)`, n),
		fmt.Sprintf(`INSERT INTO stepready.steps (task_id, name, handler, max_attempts, retryable, backoff, base_delay_ms, jitter)
			SELECT id, 's', 'flaky', %d, true, 'fixed', %d, 0 FROM stepready.tasks`, stormFailures+1, stormBackoff.Milliseconds()),
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("load storm: %w", err)
		}
	}
	return nil
}

// stormRun works n retry-storm steps to completion with a direct-dispatch Client and returns the time it took.
// Each attempt before the last fails with class transient.
func stormRun(ctx context.Context, env *Env, n int) (time.Duration, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadStorm(ctx, pool, n); err != nil {
		return 0, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("flaky", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		if s.Attempt <= stormFailures {
			return nil, steps.Fail(steps.ClassTransient, errPlanned)
		}
		return s.Input, nil
	}))
	elapsed, err := runClient(ctx, env, pool, reg, stepready.DispatchDirect, n)
	if err != nil {
		return 0, err
	}
	var bad int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE state <> 'complete' OR attempts <> $1`,
		stormFailures+1).Scan(&bad); err != nil {
		return 0, err
	}
	if bad > 0 {
		return 0, fmt.Errorf("%d storm steps did not complete at attempt %d", bad, stormFailures+1)
	}
	return elapsed, nil
}

// plainRun is the baseline of the storm: n tasks of stormFailures+1 independent no-op steps, as many attempts
// and as many tasks as the storm, worked to completion with the same client settings. It returns the time.
func plainRun(ctx context.Context, env *Env, n int) (time.Duration, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'plain' FROM generate_series(1, %d)`, n),
		fmt.Sprintf(`INSERT INTO stepready.steps (task_id, name, handler)
			SELECT t.id, 's' || g, 'noop' FROM stepready.tasks t, generate_series(1, %d) g`, stormFailures+1),
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return 0, fmt.Errorf("load plain attempts: %w", err)
		}
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	return runClient(ctx, env, pool, reg, stepready.DispatchDirect, n)
}

// retryStorm is scenario 5: steps that fail twice then succeed, against as many plain attempts in as many tasks
// (so that both sides complete the same number of tasks and differ only in failing instead of completing).
func retryStorm(ctx context.Context, env *Env, size Size) ([]Row, error) {
	n := size.StormSteps
	attempts := n * (stormFailures + 1)
	m, err := medians(
		func() (float64, error) { d, err := stormRun(ctx, env, n); return d.Seconds(), wrap("storm", err) },
		func() (float64, error) {
			d, err := plainRun(ctx, env, n)
			return d.Seconds(), wrap("plain attempts", err)
		},
	)
	if err != nil {
		return nil, err
	}
	storm, plain := time.Duration(m[0]*float64(time.Second)), time.Duration(m[1]*float64(time.Second))
	ratio := storm.Seconds() / plain.Seconds()
	return []Row{{Scenario: "5 retry storm", Unit: "s",
		Figure: fmt.Sprintf("(a) direct, %d steps × (%d transient failures, fixed %s backoff, then success) = %d attempts",
			n, stormFailures, stormBackoff, attempts),
		Value: storm.Seconds(), Baseline: fmt.Sprintf("%d no-op attempts (%d tasks × %d steps)", attempts, n, stormFailures+1), BaseVal: plain.Seconds(),
		Ratio: ratio, Target: "ratio <= 1.5", Met: boolp(ratio <= 1.5)}}, nil
}
