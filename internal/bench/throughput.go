package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/steps"
)

const benchConcurrency = 50

// loadIndependent creates n one-step tasks of no-op steps.
func loadIndependent(ctx context.Context, pool *pgxpool.Pool, n int) error {
	for _, s := range []string{
		fmt.Sprintf(`INSERT INTO stepready.tasks (name) SELECT 'tp' FROM generate_series(1, %d)`, n),
		`INSERT INTO stepready.steps (task_id, name, handler) SELECT id, 's', 'noop' FROM stepready.tasks`,
		`VACUUM ANALYZE stepready.steps`, `VACUUM ANALYZE stepready.tasks`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("load: %w", err)
		}
	}
	return nil
}

// waitCount polls query until it returns want.
func waitCount(ctx context.Context, pool *pgxpool.Pool, query string, want int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var n int
		if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d done after %s", n, want, limit)
		}
		<-time.After(10 * time.Millisecond)
	}
}

func stepsPerSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// throughputClient runs n steps through a stepready Client in the given dispatch mode.
func throughputClient(ctx context.Context, env *Env, n int, mode string) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchConcurrency+10)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadIndependent(ctx, pool, n); err != nil {
		return 0, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: mode, Concurrency: benchConcurrency,
		PollInterval: time.Second, Logger: env.Logger.With("component", "client")})
	if err != nil {
		return 0, err
	}
	begin := time.Now()
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	err = waitCount(ctx, pool, `SELECT count(*) FROM stepready.tasks WHERE status = 'complete'`, n, 10*time.Minute)
	elapsed := time.Since(begin)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = c.Stop(stopCtx)
	return stepsPerSecond(n, elapsed), err
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct{ river.WorkerDefaults[noopArgs] }

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// throughputRiver is the baseline: River alone working n no-op jobs inserted with InsertMany beforehand.
func throughputRiver(ctx context.Context, env *Env, n int) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchConcurrency+10)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: benchConcurrency}},
		Workers: workers, Logger: env.Logger.With("component", "river"), FetchCooldown: 5 * time.Millisecond,
	})
	if err != nil {
		return 0, err
	}
	for done := 0; done < n; {
		batch := min(1000, n-done)
		params := make([]river.InsertManyParams, batch)
		for i := range params {
			params[i] = river.InsertManyParams{Args: noopArgs{}}
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return 0, err
		}
		done += batch
	}
	begin := time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	err = waitCount(ctx, pool, `SELECT count(*) FROM river_job WHERE state = 'completed'`, n, 10*time.Minute)
	elapsed := time.Since(begin)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = client.Stop(stopCtx)
	return stepsPerSecond(n, elapsed), err
}

// throughputSQL is the ceiling: a tight loop calling only the SQL functions (claim a batch, start and complete
// each step), no handler machinery.
func throughputSQL(ctx context.Context, env *Env, n int) (float64, error) {
	pool, _, err := env.NewDB(ctx, 8)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadIndependent(ctx, pool, n); err != nil {
		return 0, err
	}
	begin := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker := fmt.Sprintf("raw-%d", w)
			for {
				claimed, err := store.ClaimReadySteps(ctx, pool, 100, worker, 30*time.Second)
				if err != nil {
					errs <- err
					return
				}
				if len(claimed) == 0 {
					return
				}
				batch := &pgx.Batch{}
				for _, c := range claimed {
					batch.Queue(`SELECT stepready.start_step($1, $2, 30000)`, c.StepID, worker)
				}
				if err := pool.SendBatch(ctx, batch).Close(); err != nil {
					errs <- err
					return
				}
				batch = &pgx.Batch{}
				for _, c := range claimed {
					batch.Queue(`SELECT stepready.complete_step($1, 1, '{}')`, c.StepID)
				}
				if err := pool.SendBatch(ctx, batch).Close(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	var done int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks WHERE status = 'complete'`).Scan(&done); err != nil {
		return 0, err
	}
	if done != n {
		return 0, fmt.Errorf("raw SQL loop completed %d of %d", done, n)
	}
	return stepsPerSecond(n, elapsed), nil
}

func throughput(ctx context.Context, env *Env, size Size) ([]Row, error) {
	n := size.Throughput
	direct, err := throughputClient(ctx, env, n, stepready.DispatchDirect)
	if err != nil {
		return nil, fmt.Errorf("direct: %w", err)
	}
	viaRiver, err := throughputClient(ctx, env, n, stepready.DispatchRiver)
	if err != nil {
		return nil, fmt.Errorf("river dispatch: %w", err)
	}
	riverAlone, err := throughputRiver(ctx, env, n)
	if err != nil {
		return nil, fmt.Errorf("river alone: %w", err)
	}
	raw, err := throughputSQL(ctx, env, n)
	if err != nil {
		return nil, fmt.Errorf("raw SQL: %w", err)
	}
	fig := fmt.Sprintf("%d independent no-op steps", n)
	row := func(name string, v float64, base string, bv float64, target float64) Row {
		return Row{Scenario: "2 throughput", Figure: name + ", " + fig, Value: v, Unit: "steps/s", Baseline: base,
			BaseVal: bv, Ratio: v / bv, Target: fmt.Sprintf("ratio >= %.1f", target), Met: boolp(v/bv >= target)}
	}
	return []Row{
		row("(a) direct dispatch", direct, "(c) River alone", riverAlone, 1.0),
		row("(a) direct dispatch", direct, "(d) raw SQL loop", raw, 0.6),
		row("(b) River dispatch", viaRiver, "(c) River alone", riverAlone, 0.5),
	}, nil
}
