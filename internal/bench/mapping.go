package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// Scenario 10, map steps (SPEC §19):
//   - 10a: a map step of MapElements no-op elements worked to completion, direct dispatch, against as many
//     independent no-op steps (scenario 2's load), same run; once without max_in_flight and once with a window
//     of 50 (the window releases elements as others finish);
//   - 10b: the fan-out of MapFanOut elements: the time of the claim statement that picks the map step and writes
//     its elements;
//   - 10c: claiming 100 elements of a map of MapFanOut elements against claiming 100 among 10,000 ready steps;
//   - 10d: scenario 4's diamonds whose steps return 1 KB outputs that their children read through ${deps.…},
//     against the same diamonds without outputs or references.

// loadMap creates one task whose only step maps the no-op handler over n elements (max_in_flight: window, 0 for
// none). The step is ready: the claim fans it out.
func loadMap(ctx context.Context, pool *pgxpool.Pool, n, window int) (int64, error) {
	mapDef := `{"over": "${context.items}"}`
	if window > 0 {
		mapDef = fmt.Sprintf(`{"over": "${context.items}", "max_in_flight": %d}`, window)
	}
	var id int64
	if err := pool.QueryRow(ctx, `SELECT stepready.create_task(jsonb_build_object('name', 'map',
			'context', jsonb_build_object('items', (SELECT jsonb_agg(g) FROM generate_series(1, $1::int) g)),
			'steps', jsonb_build_array(jsonb_build_object('name', 'm', 'handler', 'noop', 'map', $2::jsonb))))`,
		n, mapDef).Scan(&id); err != nil {
		return 0, fmt.Errorf("load map: %w", err)
	}
	for _, s := range []string{`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return 0, fmt.Errorf("load map: %w", err)
		}
	}
	return id, nil
}

// mapClient works a map of n no-op elements (window: max_in_flight, 0 for none) to completion with a Client in
// direct dispatch and returns elements/s.
func mapClient(ctx context.Context, env *Env, n, window int) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if _, err := loadMap(ctx, pool, n, window); err != nil {
		return 0, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	elapsed, err := runClient(ctx, env, pool, reg, stepready.DispatchDirect, 1)
	if err != nil {
		return 0, err
	}
	return stepsPerSecond(n, elapsed), nil
}

// mapWindow is the max_in_flight of 10a's windowed map: the kill test's (tests/e2e/map_kill_test.go).
const mapWindow = 50

func mapping(ctx context.Context, env *Env, size Size) ([]Row, error) {
	n := size.MapElements
	m, err := medians(
		func() (float64, error) { v, err := mapClient(ctx, env, n, 0); return v, wrap("map", err) },
		func() (float64, error) {
			v, err := mapClient(ctx, env, n, mapWindow)
			return v, wrap("windowed map", err)
		},
		func() (float64, error) {
			v, err := throughputClient(ctx, env, n, stepready.DispatchDirect)
			return v, wrap("independent", err)
		},
	)
	if err != nil {
		return nil, err
	}
	plain, windowed, independent := m[0], m[1], m[2]
	row := func(fig string, v float64) Row {
		return Row{Scenario: "10a map throughput", Figure: fig + env.Options.label(), Value: v, Unit: "steps/s",
			Baseline: fmt.Sprintf("%d independent steps", n), BaseVal: independent, Ratio: v / independent,
			Target: "ratio >= 0.8", Met: boolp(v/independent >= 0.8)}
	}
	rows := []Row{
		row(fmt.Sprintf("direct dispatch, a map of %d no-op elements", n), plain),
		row(fmt.Sprintf("direct dispatch, a map of %d no-op elements, max_in_flight %d", n, mapWindow), windowed),
	}
	_ = time.Second
	return rows, nil
}
