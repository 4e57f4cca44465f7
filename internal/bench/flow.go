package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// Scenario 9, flow control (SPEC §14):
//   - 9a: the claim cost with every step keyed, 10,000 distinct keys among FlowClaimLarge steps, against the same
//     keys among FlowClaimSmall steps (the claim visits one key per step it takes, whatever the table holds);
//   - 9b: no-op throughput with every step keyed (1,000 keys, limit 100 each) against unkeyed, same run;
//   - 9c: the cost of a claim whose steps are all rate limited (one token each, 100 keys) against an unkeyed claim.

// flowKeys is the number of distinct keys of 9a.
const flowKeys = 10_000

// fillKeyed loads total ready one-step tasks whose steps are spread over keys concurrency keys (limit 100) and
// creates the keys' flow_state rows (as their first claims would have).
func fillKeyed(ctx context.Context, pool *pgxpool.Pool, total, keys int, rate bool) error {
	flow := fmt.Sprintf(`'k' || (g %% %d), 100, NULL, NULL, NULL`, keys)
	if rate {
		flow = fmt.Sprintf(`NULL, NULL, 'k' || (g %% %d), 1000000, 1000`, keys)
	}
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'flow' FROM generate_series(1, %d)`, total),
		fmt.Sprintf(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit, rate_key,
			rate_limit, rate_period_ms) SELECT g, 's', 'noop', %s FROM generate_series(1, %d) g`, flow, total),
		// As the keys' first claims leave them: the limits applied recorded.
		`INSERT INTO stepready.flow_state (key, concurrency_limit, rate_limit, rate_period_ms)
			SELECT DISTINCT flow_key, concurrency_limit, rate_limit, rate_period_ms FROM stepready.steps WHERE flow_key <> ''`,
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`, `VACUUM ANALYZE stepready.flow_state`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("fill keyed: %w", err)
		}
	}
	return nil
}

func flowControl(ctx context.Context, env *Env, size Size) ([]Row, error) {
	measure := func(total, keys int, rate bool) (time.Duration, error) {
		pool, _, err := env.NewDB(ctx, 4)
		if err != nil {
			return 0, err
		}
		defer pool.Close()
		if keys == 0 {
			if err := loadIndependent(ctx, pool, total); err != nil {
				return 0, err
			}
		} else if err := fillKeyed(ctx, pool, total, keys, rate); err != nil {
			return 0, err
		}
		return timeClaim(ctx, pool, 30)
	}
	small, err := measure(flowKeys, flowKeys, false)
	if err != nil {
		return nil, err
	}
	large, err := measure(size.FlowClaimLarge, flowKeys, false)
	if err != nil {
		return nil, err
	}
	unkeyed, err := measure(flowKeys, 0, false)
	if err != nil {
		return nil, err
	}
	rated, err := measure(flowKeys, 100, true)
	if err != nil {
		return nil, err
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	claimRatio := float64(large) / float64(small)
	rows := []Row{
		{Scenario: "9a flow claim cost", Figure: fmt.Sprintf("claim 100, %d keys among %d keyed steps", flowKeys, size.FlowClaimLarge),
			Value: ms(large), Unit: "ms", Baseline: fmt.Sprintf("among %d", flowKeys), BaseVal: ms(small),
			Ratio: claimRatio, Target: "ratio <= 1.2", Met: boolp(claimRatio <= 1.2)},
		{Scenario: "9c rate-limited claim", Figure: "claim 100 steps of 100 rate keys (a token each)",
			Value: ms(rated), Unit: "ms", Baseline: "claim 100 unkeyed", BaseVal: ms(unkeyed),
			Ratio: float64(rated) / float64(unkeyed), Target: "reported"},
		{Scenario: "9a' keyed claim", Figure: fmt.Sprintf("claim 100 of %d steps, one key each", flowKeys),
			Value: ms(small), Unit: "ms", Baseline: "claim 100 unkeyed", BaseVal: ms(unkeyed),
			Ratio: float64(small) / float64(unkeyed), Target: "reported"},
	}

	keyed := func() (float64, error) { return throughputKeyed(ctx, env, size.Throughput, 1000) }
	plain := func() (float64, error) { return throughputKeyed(ctx, env, size.Throughput, 0) }
	m, err := medians(keyed, plain)
	if err != nil {
		return nil, err
	}
	ratio := m[0] / m[1]
	rows = append(rows, Row{Scenario: "9b keyed throughput",
		Figure: fmt.Sprintf("%d no-op steps, 1,000 keys (limit 100 each), direct", size.Throughput),
		Value:  m[0], Unit: "steps/s", Baseline: "unkeyed, same run", BaseVal: m[1], Ratio: ratio,
		Target: "ratio >= 0.8", Met: boolp(ratio >= 0.8)})
	return rows, nil
}

// throughputKeyed runs n one-step no-op tasks through a client in direct dispatch, their steps spread over keys
// concurrency keys of limit 100 (0: unkeyed).
func throughputKeyed(ctx context.Context, env *Env, n, keys int) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if keys == 0 {
		err = loadIndependent(ctx, pool, n)
	} else {
		err = fillKeyed(ctx, pool, n, keys, false)
	}
	if err != nil {
		return 0, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	elapsed, err := runClient(ctx, env, pool, reg, stepready.DispatchDirect, n)
	return stepsPerSecond(n, elapsed), err
}
