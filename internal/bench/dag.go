package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// diamondSteps is the number of steps of one diamond task: a → b, a → c, b → d, c → d.
const diamondSteps = 4

// loadDiamonds creates n diamond tasks of no-op steps. The edge triggers count each step's unfinished parents,
// so only the n `a` steps are ready at first.
func loadDiamonds(ctx context.Context, pool *pgxpool.Pool, n int) error {
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'diamond' FROM generate_series(1, %d)`, n),
		`INSERT INTO stepready.steps (task_id, name, handler)
			SELECT t.id, s.name, 'noop' FROM stepready.tasks t, unnest(ARRAY['a', 'b', 'c', 'd']) AS s(name)`,
		`INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
			SELECT p.id, c.id
			FROM (VALUES ('a', 'b'), ('a', 'c'), ('b', 'd'), ('c', 'd')) AS e(parent, child)
			JOIN stepready.steps p ON p.name = e.parent
			JOIN stepready.steps c ON c.task_id = p.task_id AND c.name = e.child`,
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`, `VACUUM ANALYZE stepready.step_edges`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("load diamonds: %w", err)
		}
	}
	var ready int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE pending_parents = 0`).Scan(&ready); err != nil {
		return err
	}
	if ready != n {
		return fmt.Errorf("load diamonds: %d steps without unfinished parents, want %d", ready, n)
	}
	return nil
}

// dagClient works n diamond tasks to completion with a Client in the given dispatch mode and returns steps/s.
func dagClient(ctx context.Context, env *Env, n int, mode string) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadDiamonds(ctx, pool, n); err != nil {
		return 0, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	elapsed, err := runClient(ctx, env, pool, reg, mode, n)
	if err != nil {
		return 0, err
	}
	return stepsPerSecond(n*diamondSteps, elapsed), nil
}

// dagThroughput is scenario 4: diamond tasks to completion, against the baselines of scenario 2 run on as many
// (independent) steps.
func dagThroughput(ctx context.Context, env *Env, size Size) ([]Row, error) {
	n := size.DAGTasks
	total := n * diamondSteps
	m, err := medians(
		func() (float64, error) {
			v, err := dagClient(ctx, env, n, stepready.DispatchDirect)
			return v, wrap("direct", err)
		},
		func() (float64, error) {
			v, err := dagClient(ctx, env, n, stepready.DispatchRiver)
			return v, wrap("river dispatch", err)
		},
		func() (float64, error) {
			v, err := throughputRiver(ctx, env, total)
			return v, wrap("river alone", err)
		},
		func() (float64, error) { v, err := throughputSQL(ctx, env, total); return v, wrap("raw SQL", err) },
	)
	if err != nil {
		return nil, err
	}
	direct, viaRiver, riverAlone, raw := m[0], m[1], m[2], m[3]
	fig := fmt.Sprintf("%d diamond tasks (%d steps)", n, total)
	row := func(name string, v float64, base string, bv float64, target float64) Row {
		return Row{Scenario: "4 DAG throughput", Figure: name + ", " + fig, Value: v, Unit: "steps/s", Baseline: base,
			BaseVal: bv, Ratio: v / bv, Target: fmt.Sprintf("ratio >= %.1f", target), Met: boolp(v/bv >= target)}
	}
	return []Row{
		row("(a) direct dispatch", direct, "(c) River alone", riverAlone, 1.0),
		row("(a) direct dispatch", direct, "(d) raw SQL loop", raw, 0.6),
		row("(b) River dispatch", viaRiver, "(c) River alone", riverAlone, 0.5),
	}, nil
}
