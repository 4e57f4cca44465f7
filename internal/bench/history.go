package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// loadHistory fills a fresh database with finished work: finished/4 complete tasks of 4 complete steps, each step
// with the four events a run leaves (enqueued, started, succeeded, completed), as a daemon that has run for a
// while without pruning would have them.
func loadHistory(ctx context.Context, pool *pgxpool.Pool, finished int) error {
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'old' FROM generate_series(1, %d)`, finished/4),
		`INSERT INTO stepready.steps (task_id, name, handler, state, attempts, output, last_attempted_at)
			SELECT t.id, 's' || g, 'noop', 'complete', 1, '{}', now() FROM stepready.tasks t, generate_series(1, 4) g`,
		`INSERT INTO stepready.step_events (task_id, step_id, attempt, iteration, event, from_state, to_state)
			SELECT s.task_id, s.id, e.attempt, 0, e.event, e.from_state, e.to_state
			  FROM stepready.steps s, (VALUES ('step.enqueued', 0, 'pending', 'enqueued'),
			                                  ('attempt.started', 1, 'enqueued', 'in_progress'),
			                                  ('attempt.succeeded', 1, 'in_progress', 'in_progress'),
			                                  ('step.completed', 1, 'in_progress', 'complete'))
			                           AS e(event, attempt, from_state, to_state)`,
		`VACUUM ANALYZE stepready.tasks`, `VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.step_events`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("load history: %w", err)
		}
	}
	return nil
}

// throughputWithHistory is scenario 2a with size.HistorySteps finished steps (and their events) already in the
// tables: n new one-step tasks worked by a direct-dispatch Client, in steps/s.
func throughputWithHistory(ctx context.Context, env *Env, n, finished int) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadHistory(ctx, pool, finished); err != nil {
		return 0, err
	}
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'tp' FROM generate_series(1, %d)`, n),
		`INSERT INTO stepready.steps (task_id, name, handler) SELECT id, 's', 'noop' FROM stepready.tasks WHERE name = 'tp'`,
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return 0, fmt.Errorf("load: %w", err)
		}
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	elapsed, err := runClient(ctx, env, pool, reg, stepready.DispatchDirect, finished/4+n)
	return stepsPerSecond(n, elapsed), err
}

// history is scenario 2 again on a database that has been running for a while: direct dispatch with
// size.HistorySteps finished steps and their events in the tables, against scenario 2a on empty tables, in the
// same run (medians of three, interleaved, as scenario 2).
func history(ctx context.Context, env *Env, size Size) ([]Row, error) {
	vals, err := medians(
		func() (float64, error) { return throughputWithHistory(ctx, env, size.Throughput, size.HistorySteps) },
		func() (float64, error) { return throughputClient(ctx, env, size.Throughput, stepready.DispatchDirect) },
	)
	if err != nil {
		return nil, err
	}
	ratio := vals[0] / vals[1]
	return []Row{{Scenario: "2c throughput with history", Figure: fmt.Sprintf("direct dispatch, %d steps, %d finished steps and their events in the tables",
		size.Throughput, size.HistorySteps), Value: vals[0], Unit: "steps/s", Baseline: "2a on empty tables", BaseVal: vals[1],
		Ratio: ratio, Target: ">= 0.9", Met: boolp(ratio >= 0.9)}}, nil
}
