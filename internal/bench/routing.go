package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fillRouted loads others ready steps of handlers other0 … other4, in queues default and media (a third of them
// keyed, k0 … k49), and mine ready steps of handler mine in queue default, each of its own task: the claim of
// scenario 12a takes steps of mine only.
func fillRouted(ctx context.Context, pool *pgxpool.Pool, others, mine int) error {
	stmts := []string{
		`INSERT INTO stepready.tasks (name) VALUES ('others')`,
		fmt.Sprintf(`INSERT INTO stepready.steps (task_id, name, handler, queue, concurrency_key, concurrency_limit)
			SELECT (SELECT id FROM stepready.tasks WHERE name = 'others'), 'o' || g, 'other' || (g %% 5),
			       (ARRAY['default', 'media'])[1 + g %% 2],
			       CASE WHEN g %% 3 = 0 THEN 'k' || (g %% 50) END, CASE WHEN g %% 3 = 0 THEN 1000000 END
			  FROM generate_series(1, %d) g`, others),
		fmt.Sprintf(`WITH t AS (INSERT INTO stepready.tasks (name) SELECT 'mine' FROM generate_series(1, %d) RETURNING id)
			INSERT INTO stepready.steps (task_id, name, handler) SELECT t.id, 'm', 'mine' FROM t`, mine),
		`INSERT INTO stepready.flow_state (key) SELECT 'k' || g FROM generate_series(0, 49) g ON CONFLICT DO NOTHING`,
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`,
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("fill routed: %w", err)
		}
	}
	return nil
}

// timeQuery times query (a claim of 100 steps) in a rolled-back transaction, median of n runs.
func timeQuery(ctx context.Context, pool *pgxpool.Pool, n int, query string) (time.Duration, error) {
	var ds []time.Duration
	for range n {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
		if err != nil {
			return 0, err
		}
		begin := time.Now()
		var k int
		err = tx.QueryRow(ctx, `SELECT count(*) FROM (`+query+`) q`).Scan(&k)
		ds = append(ds, time.Since(begin))
		if rerr := tx.Rollback(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			return 0, err
		}
		if k != 100 {
			return 0, fmt.Errorf("claimed %d, want 100", k)
		}
	}
	return median(ds), nil
}

// routedClaim is scenario 12a (SPEC §21, issue 23): a claim of 100 steps of one handler behind N ready steps of
// other handlers (and other queues), against the same claim behind 10,000; with both filters (the daemon's claim)
// and with the handler alone.
func routedClaim(ctx context.Context, env *Env, size Size) ([]Row, error) {
	claims := []struct{ figure, query string }{
		{"queue and handler", `SELECT step_id FROM stepready.claim_ready_steps(100, 'bench', 30000,
			p_queues => ARRAY['default'], p_handlers => ARRAY['mine'])`},
		{"handler only", `SELECT step_id FROM stepready.claim_ready_steps(100, 'bench', 30000,
			p_handlers => ARRAY['mine'])`},
	}
	measure := func(others int) ([]time.Duration, error) {
		pool, _, err := env.NewDB(ctx, 4)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		if err := fillRouted(ctx, pool, others, size.ClaimReady); err != nil {
			return nil, err
		}
		var out []time.Duration
		for _, c := range claims {
			// Each claim variant on the same table: the rolled-back claims of the one before left a dead version
			// of each row they updated, which the next variant's updates would pay for.
			if _, err := pool.Exec(ctx, `VACUUM stepready.steps`); err != nil {
				return nil, err
			}
			d, err := timeQuery(ctx, pool, 30, c.query)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.figure, err)
			}
			out = append(out, d)
		}
		return out, nil
	}
	small, err := measure(size.ClaimSmall)
	if err != nil {
		return nil, err
	}
	large, err := measure(size.ClaimLarge)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for i, c := range claims {
		ratio := float64(large[i]) / float64(small[i])
		rows = append(rows, Row{Scenario: "12a routed claim",
			Figure: fmt.Sprintf("claim 100 of %d ready of one handler (%s) behind %d of others", size.ClaimReady,
				c.figure, size.ClaimLarge),
			Value: float64(large[i].Microseconds()) / 1000, Unit: "ms",
			Baseline: fmt.Sprintf("behind %d", size.ClaimSmall), BaseVal: float64(small[i].Microseconds()) / 1000,
			Ratio: ratio, Target: "ratio <= 1.2", Met: boolp(ratio <= 1.2)})
	}
	return rows, nil
}
