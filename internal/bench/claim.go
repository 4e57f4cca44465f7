package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fill loads a database with total steps of which ready are claimable: the rest are half complete steps and
// half pending steps behind a running parent, in tasks of 100 steps.
func fill(ctx context.Context, pool *pgxpool.Pool, total, ready int) error {
	const perTask = 100
	rest := total - ready
	stmts := []string{
		// Finished work: complete tasks of complete steps.
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'done' FROM generate_series(1, %d)`, rest/2/perTask),
		fmt.Sprintf(`INSERT INTO stepready.steps (task_id, name, handler, state)
			SELECT t.id, 's' || g, 'noop', 'complete' FROM stepready.tasks t, generate_series(1, %d) g
			WHERE t.name = 'done'`, perTask),
		// Blocked work: tasks whose steps wait behind one running parent.
		fmt.Sprintf(`INSERT INTO stepready.tasks (name, status) SELECT 'blocked', 'in_progress' FROM generate_series(1, %d)`, rest/2/perTask),
		`INSERT INTO stepready.steps (task_id, name, handler, state, attempts)
			SELECT id, 'parent', 'noop', 'in_progress', 1 FROM stepready.tasks WHERE name = 'blocked'`,
		fmt.Sprintf(`INSERT INTO stepready.steps (task_id, name, handler)
			SELECT t.id, 's' || g, 'noop' FROM stepready.tasks t, generate_series(2, %d) g WHERE t.name = 'blocked'`, perTask),
		`INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
			SELECT p.id, c.id FROM stepready.steps p JOIN stepready.steps c ON c.task_id = p.task_id AND c.name <> 'parent'
			WHERE p.name = 'parent'`,
		// Ready work.
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'ready' FROM generate_series(1, %d)`, ready),
		`INSERT INTO stepready.steps (task_id, name, handler) SELECT id, 'only', 'noop' FROM stepready.tasks WHERE name = 'ready'`,
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`, `VACUUM ANALYZE stepready.step_edges`,
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	return nil
}

// timeClaim times claim_ready_steps(100) in a rolled-back transaction, median of n runs.
func timeClaim(ctx context.Context, pool *pgxpool.Pool, n int) (time.Duration, error) {
	var ds []time.Duration
	for range n {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
		if err != nil {
			return 0, err
		}
		begin := time.Now()
		rows, err := tx.Query(ctx, `SELECT step_id FROM stepready.claim_ready_steps(100, 'bench', 30000)`)
		if err != nil {
			_ = tx.Rollback(ctx)
			return 0, err
		}
		k := 0
		for rows.Next() {
			k++
		}
		rows.Close()
		ds = append(ds, time.Since(begin))
		if err := tx.Rollback(ctx); err != nil {
			return 0, err
		}
		if k != 100 {
			return 0, fmt.Errorf("claimed %d, want 100", k)
		}
	}
	return median(ds), nil
}

func claimCost(ctx context.Context, env *Env, size Size) ([]Row, error) {
	measure := func(total int) (time.Duration, error) {
		pool, _, err := env.NewDB(ctx, 4)
		if err != nil {
			return 0, err
		}
		defer pool.Close()
		if err := fill(ctx, pool, total, size.ClaimReady); err != nil {
			return 0, err
		}
		return timeClaim(ctx, pool, 30)
	}
	small, err := measure(size.ClaimSmall)
	if err != nil {
		return nil, err
	}
	large, err := measure(size.ClaimLarge)
	if err != nil {
		return nil, err
	}
	ratio := float64(large) / float64(small)
	return []Row{{Scenario: "1 claim cost", Figure: fmt.Sprintf("claim 100 of %d ready among %d steps", size.ClaimReady, size.ClaimLarge),
		Value: float64(large.Microseconds()) / 1000, Unit: "ms",
		Baseline: fmt.Sprintf("among %d", size.ClaimSmall), BaseVal: float64(small.Microseconds()) / 1000,
		Ratio: ratio, Target: "ratio <= 1.2", Met: boolp(ratio <= 1.2)}}, nil
}
