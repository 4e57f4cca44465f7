package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// Scenario 10, map steps and data flow (SPEC §18, §19):
//   - 10a: a map step of MapElements no-op elements worked to completion, direct dispatch, against as many
//     independent no-op steps (scenario 2's load), same run. The array is a literal of the map's definition; the
//     same map over ${context.items} (the context then holds the array, and every element's start carries the
//     context, SPEC §18) and over a literal with max_in_flight 50 are shown beside it;
//   - 10b: the fan-out of MapFanOut elements: the time of the claim statement that picks the map step and writes
//     its elements (one statement);
//   - 10c: claim_ready_steps(100) from a map of MapFanOut ready elements against the same claim among 10,000
//     ready steps;
//   - 10d: scenario 4's diamonds whose steps return 1 KB outputs that their children read through ${deps.…}
//     (DataflowDiamonds tasks), against the same diamonds without outputs or references, both created with
//     create_tasks, direct dispatch.

// mapOver is where the array of a 10a map comes from.
type mapOver int

const (
	overLiteral mapOver = iota // a literal array in the map's definition
	overContext                // ${context.items}
)

// loadMap creates one task whose only step maps the no-op handler over the n items 1 … n (max_in_flight: window,
// 0 for none). The step is ready: the first claim fans it out.
func loadMap(ctx context.Context, pool *pgxpool.Pool, n, window int, over mapOver) error {
	items := `(SELECT jsonb_agg(g) FROM generate_series(1, $1::int) g)`
	mapDef, taskContext := `jsonb_build_object('over', `+items+`)`, `'{}'::jsonb`
	if over == overContext {
		mapDef, taskContext = `jsonb_build_object('over', '${context.items}')`, `jsonb_build_object('items', `+items+`)`
	}
	limits := `{"max_elements": 100000}`
	if window > 0 {
		limits = fmt.Sprintf(`{"max_elements": 100000, "max_in_flight": %d}`, window)
	}
	if _, err := pool.Exec(ctx, `SELECT stepready.create_task(jsonb_build_object('name', 'map', 'context', `+taskContext+`,
			'steps', jsonb_build_array(jsonb_build_object('name', 'm', 'handler', 'noop', 'map', `+mapDef+` || $2::jsonb))))`,
		n, limits); err != nil {
		return fmt.Errorf("load map: %w", err)
	}
	for _, s := range []string{`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("load map: %w", err)
		}
	}
	return nil
}

// mapClient works a map of n no-op elements to completion with a Client in direct dispatch and returns
// elements/s, from the client's start (the fan-out included) to the last completion.
func mapClient(ctx context.Context, env *Env, n, window int, over mapOver) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadMap(ctx, pool, n, window, over); err != nil {
		return 0, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	elapsed, err := runClient(ctx, env, pool, reg, stepready.DispatchDirect, 1)
	if err != nil {
		return 0, err
	}
	var total int
	if err := pool.QueryRow(ctx, `SELECT jsonb_array_length(output) FROM stepready.steps WHERE name = 'm'`).
		Scan(&total); err != nil {
		return 0, err
	}
	if total != n {
		return 0, fmt.Errorf("the map's output holds %d elements, want %d", total, n)
	}
	return stepsPerSecond(n, elapsed), nil
}

// mapWindow is the max_in_flight of 10a's windowed map: the kill test's (tests/e2e/map_kill_test.go).
const mapWindow = 50

// fanOut loads a map of n elements over ${context.items}, times the claim statement that fans it out, then
// empties the context (a started element carries it) and analyzes the table. It returns the pool, for 10c.
func fanOut(ctx context.Context, env *Env, n int) (*pgxpool.Pool, time.Duration, error) {
	pool, _, err := env.NewDB(ctx, 4)
	if err != nil {
		return nil, 0, err
	}
	if err := loadMap(ctx, pool, n, 0, overContext); err != nil {
		pool.Close()
		return nil, 0, err
	}
	begin := time.Now()
	var claimed int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM stepready.claim_ready_steps(100, 'bench', 30000)`).Scan(&claimed)
	elapsed := time.Since(begin)
	if err == nil && claimed != 0 {
		err = fmt.Errorf("the fanning claim handed over %d steps, want 0", claimed)
	}
	for _, s := range []string{`UPDATE stepready.tasks SET context = '{}'`, `VACUUM ANALYZE stepready.steps`,
		`VACUUM ANALYZE stepready.tasks`} {
		if err == nil {
			_, err = pool.Exec(ctx, s)
		}
	}
	var total int
	if err == nil {
		err = pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE map_step_id IS NOT NULL`).Scan(&total)
	}
	if err == nil && total != n {
		err = fmt.Errorf("fan-out wrote %d elements, want %d", total, n)
	}
	if err != nil {
		pool.Close()
		return nil, 0, fmt.Errorf("fan-out: %w", err)
	}
	return pool, elapsed, nil
}

// blob is the 1 KB string of 10d's outputs.
var blob = strings.Repeat("x", 1024)

// diamondDefinitions returns n diamond task definitions (a → b, a → c, b → d, c → d) as a JSON array. With flow,
// a's input holds a 1 KB string, b and c read it through ${deps.a.pad}, d reads both through ${deps.b.pad} and
// ${deps.c.pad}; the no-op handler returns its input, so every output is 1 KB (d's 2 KB) and flows to the
// children. Without, the steps have no input.
func diamondDefinitions(n int, flow bool) string {
	in := func(s string) string {
		if !flow {
			return ""
		}
		return `, "input": ` + s
	}
	one := `{"name": "diamond", "steps": [
		{"name": "a", "handler": "noop"` + in(`{"pad": "`+blob+`"}`) + `},
		{"name": "b", "handler": "noop", "depends_on": ["a"]` + in(`{"pad": "${deps.a.pad}"}`) + `},
		{"name": "c", "handler": "noop", "depends_on": ["a"]` + in(`{"pad": "${deps.a.pad}"}`) + `},
		{"name": "d", "handler": "noop", "depends_on": ["b", "c"]` + in(`{"pad": "${deps.b.pad}", "c": "${deps.c.pad}"}`) + `}]}`
	defs := make([]string, n)
	for i := range defs {
		defs[i] = one
	}
	return "[" + strings.Join(defs, ",") + "]"
}

// dataflowClient works n diamond tasks (with or without 1 KB outputs flowing to the children) to completion with
// a Client in direct dispatch and returns steps/s.
func dataflowClient(ctx context.Context, env *Env, n int, flow bool) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	const batch = 1000
	for done := 0; done < n; done += batch {
		if _, err := pool.Exec(ctx, `SELECT count(*) FROM stepready.create_tasks($1::jsonb)`,
			diamondDefinitions(min(batch, n-done), flow)); err != nil {
			return 0, fmt.Errorf("load diamonds: %w", err)
		}
	}
	for _, s := range []string{`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`,
		`VACUUM ANALYZE stepready.step_edges`} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return 0, err
		}
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	elapsed, err := runClient(ctx, env, pool, reg, stepready.DispatchDirect, n)
	if err != nil {
		return 0, err
	}
	if flow {
		var size int
		if err := pool.QueryRow(ctx, `SELECT min(octet_length(output::text)) FROM stepready.steps WHERE name = 'd'`).
			Scan(&size); err != nil {
			return 0, err
		}
		if size < 2*len(blob) {
			return 0, fmt.Errorf("a d step's output is %d bytes: the outputs did not flow", size)
		}
	}
	return stepsPerSecond(n*diamondSteps, elapsed), nil
}

func mapping(ctx context.Context, env *Env, size Size) ([]Row, error) {
	n := size.MapElements
	label := env.Options.label()
	m, err := medians(
		func() (float64, error) { v, err := mapClient(ctx, env, n, 0, overLiteral); return v, wrap("map", err) },
		func() (float64, error) {
			v, err := mapClient(ctx, env, n, 0, overContext)
			return v, wrap("map over the context", err)
		},
		func() (float64, error) {
			v, err := mapClient(ctx, env, n, mapWindow, overLiteral)
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
	literal, byContext, windowed, independent := m[0], m[1], m[2], m[3]
	base := fmt.Sprintf("%d independent steps", n)
	rows := []Row{
		{Scenario: "10a map throughput", Figure: fmt.Sprintf("direct dispatch%s, a map of %d no-op elements (literal array)",
			label, n), Value: literal, Unit: "steps/s", Baseline: base, BaseVal: independent, Ratio: literal / independent,
			Target: "ratio >= 0.8", Met: boolp(literal/independent >= 0.8)},
		{Scenario: "10a map throughput", Figure: fmt.Sprintf("the same over ${context.items} (each start carries the "+
			"%d-item context)", n), Value: byContext, Unit: "steps/s", Baseline: base, BaseVal: independent,
			Ratio: byContext / independent, Target: "ratio >= 0.8", Met: boolp(byContext/independent >= 0.8)},
		{Scenario: "10a map throughput", Figure: fmt.Sprintf("the same (literal) with max_in_flight %d", mapWindow),
			Value: windowed, Unit: "steps/s", Baseline: base, BaseVal: independent, Ratio: windowed / independent,
			Target: "context (no target)"},
	}

	// 10b and 10c: fan out once, then claim from the map; the baseline claims among 10,000 ready steps.
	pool, fan, err := fanOut(ctx, env, size.MapFanOut)
	if err != nil {
		return nil, err
	}
	fromMap, err := timeClaim(ctx, pool, 30)
	pool.Close()
	if err != nil {
		return nil, fmt.Errorf("claim from the map: %w", err)
	}
	pool, _, err = env.NewDB(ctx, 4)
	if err != nil {
		return nil, err
	}
	err = loadIndependent(ctx, pool, 10_000)
	var among time.Duration
	if err == nil {
		among, err = timeClaim(ctx, pool, 30)
	}
	pool.Close()
	if err != nil {
		return nil, fmt.Errorf("claim among ready steps: %w", err)
	}
	claimRatio := float64(fromMap) / float64(among)
	rows = append(rows,
		Row{Scenario: "10b map fan-out", Figure: fmt.Sprintf("the claim statement that fans out %d elements%s",
			size.MapFanOut, label), Value: millis(fan), Unit: "ms", Target: "<= 2000 ms", Met: boolp(fan <= 2*time.Second)},
		Row{Scenario: "10c map claim", Figure: fmt.Sprintf("claim 100 elements of a map of %d%s", size.MapFanOut, label),
			Value: millis(fromMap), Unit: "ms", Baseline: "among 10000 ready steps", BaseVal: millis(among),
			Ratio: claimRatio, Target: "ratio <= 1.2", Met: boolp(claimRatio <= 1.2)})

	// 10d.
	d := size.DataflowDiamonds
	m, err = medians(
		func() (float64, error) {
			v, err := dataflowClient(ctx, env, d, true)
			return v, wrap("with outputs", err)
		},
		func() (float64, error) { v, err := dataflowClient(ctx, env, d, false); return v, wrap("without", err) },
	)
	if err != nil {
		return nil, err
	}
	flow, plain := m[0], m[1]
	rows = append(rows, Row{Scenario: "10d data flow", Figure: fmt.Sprintf("direct dispatch%s, %d diamond tasks, 1 KB "+
		"outputs read by the children through ${deps.…}", label, d), Value: flow, Unit: "steps/s",
		Baseline: "without outputs or references", BaseVal: plain, Ratio: flow / plain, Target: "ratio >= 0.9",
		Met: boolp(flow/plain >= 0.9)})
	return rows, nil
}
