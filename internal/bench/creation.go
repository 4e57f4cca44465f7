package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// creationBatch is the number of chains per create_tasks call in scenario 7b.
const creationBatch = 100

// chainBatch returns a JSON array of n chain definitions.
func chainBatch(n int) string {
	defs := make([]json.RawMessage, n)
	for i := range defs {
		defs[i] = chainDefinition
	}
	b, _ := json.Marshal(defs)
	return string(b)
}

// creation is scenario 7: (a) create_task of a 4-step chain, one per statement, from one client on a freshly
// migrated database that is never analyzed (autovacuum off for its tables): p50 latency, and the rate of the
// last window over the first (a plan made for the tables' first, tiny state would slow creation down as they
// grow); (b) create_tasks in batches of 100 chains from 2 clients, in steps/s, against a multi-row INSERT of as
// many river_job rows per statement (the shape of River's InsertMany) from 2 clients, for the same time.
func creation(ctx context.Context, env *Env, size Size) ([]Row, error) {
	pool, _, err := env.NewDB(ctx, 4)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// Never analyzed for the whole run: autovacuum would otherwise analyze the growing tables and hide a plan
	// that only suits an empty table.
	for _, table := range []string{"tasks", "steps", "step_edges"} {
		if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE stepready.%s SET (autovacuum_enabled = off)`, table)); err != nil {
			return nil, err
		}
	}

	// 7a: one client, one task per statement.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	window := size.CreationRun / 6
	var lat []time.Duration
	var first, last int
	begin := time.Now()
	for time.Since(begin) < size.CreationRun {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`, string(chainDefinition)); err != nil {
			conn.Release()
			return nil, fmt.Errorf("create_task: %w", err)
		}
		d := time.Since(t0)
		lat = append(lat, d)
		switch at := time.Since(begin); {
		case at <= window:
			first++
		case at > size.CreationRun-window:
			last++
		}
	}
	var trips []time.Duration
	for range 500 {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
			conn.Release()
			return nil, err
		}
		trips = append(trips, time.Since(t0))
	}
	conn.Release()
	p50, trip := median(lat), median(trips)
	rate := float64(last) / float64(max(first, 1))
	rows := []Row{
		{Scenario: "7a creation", Figure: "create_task of a 4-step chain, one client: p50 latency", Value: millis(p50),
			Unit: "ms", Baseline: "SELECT 1 round trip", BaseVal: millis(trip), Ratio: float64(p50) / float64(trip),
			Target: "<= 1 ms", Met: boolp(p50 <= time.Millisecond)},
		{Scenario: "7a creation", Figure: fmt.Sprintf("tasks created in the last %s over the first %s of %s, never analyzed (%d tasks)",
			window, window, size.CreationRun, len(lat)), Value: rate, Unit: "×", Target: ">= 0.8", Met: boolp(rate >= 0.8)},
	}

	// 7b: create_tasks in batches against River's InsertMany shape, 2 clients each, for the same time.
	batch := chainBatch(creationBatch)
	bulk, err := ratePerClient(ctx, pool, 2, size.CreationBulkRun, func(ctx context.Context, c *pgxpool.Conn) (int, error) {
		rows, err := c.Query(ctx, `SELECT count(*) FROM stepready.create_tasks($1::jsonb)`, batch)
		if err != nil {
			return 0, err
		}
		rows.Close()
		return 4 * creationBatch, rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("create_tasks: %w", err)
	}
	args := make([]string, 4*creationBatch)
	for i := range args {
		args[i] = fmt.Sprintf(`{"step_id": %d, "claimed_at": "2026-11-24T00:00:00Z"}`, i)
	}
	river, err := ratePerClient(ctx, pool, 2, size.CreationBulkRun, func(ctx context.Context, c *pgxpool.Conn) (int, error) {
		_, err := c.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state, tags)
			SELECT a, 'stepready_step', 1, 1, 'default', now(), 'available', '{}'
			  FROM unnest($1::jsonb[]) AS a`, args)
		return len(args), err
	})
	if err != nil {
		return nil, fmt.Errorf("river_job insert: %w", err)
	}
	ratio := bulk / river
	rows = append(rows, Row{Scenario: "7b bulk creation", Figure: fmt.Sprintf("create_tasks, batches of %d 4-step chains, 2 clients",
		creationBatch), Value: bulk, Unit: "steps/s", Baseline: "river_job multi-row INSERT", BaseVal: river, Ratio: ratio,
		Target: ">= 0.3 (stretch 0.5)", Met: boolp(ratio >= 0.3)})
	return rows, nil
}

// ratePerClient runs op on clients connections in a loop for d and returns the items per second it reported.
func ratePerClient(ctx context.Context, pool *pgxpool.Pool, clients int, d time.Duration,
	op func(ctx context.Context, c *pgxpool.Conn) (int, error)) (float64, error) {
	var items atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	begin := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
				for time.Since(begin) < d {
					n, err := op(ctx, c)
					if err != nil {
						return err
					}
					items.Add(int64(n))
				}
				return nil
			})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(items.Load()) / elapsed.Seconds(), nil
}
