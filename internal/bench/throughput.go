package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/dispatch"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/steps"
)

// benchConcurrency is the concurrency of the stepready clients of the throughput scenarios (2, 4, 5 and the daemon
// of 6): River's benchmark's worker count. The handlers return at once, so what it sets is how many attempts can
// be between their claim and the record of their outcomes, and so how large the batches get (measured on the
// benchmark machine, 50,000 steps, direct dispatch: 50 → 12k, 500 → 23k, 2,000 → 24-26k steps/s).
const benchConcurrency = 2000

// benchPoolConns is the connection pool of every client of the throughput scenarios: a client works with a few
// connections (the claimer, the recorder, River's fetchers), not one per attempt.
const benchPoolConns = 60

// River alone is tuned as River's own benchmark (cmd/river/riverbench) tunes it: 2,000 workers, a 2 ms fetch
// cooldown and a 20 ms fetch poll.
const (
	riverBenchWorkers       = 2000
	riverBenchFetchCooldown = 2 * time.Millisecond
	riverBenchFetchPoll     = 20 * time.Millisecond
)

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

// waitRiver polls every 10 ms until River has no job left to work (an index probe of river_job by state, whose
// cost does not grow with the jobs done), then checks that want jobs completed.
func waitRiver(ctx context.Context, pool *pgxpool.Pool, want int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var busy bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job
			WHERE state IN ('available', 'running', 'retryable', 'scheduled', 'pending'))`).Scan(&busy); err != nil {
			return err
		}
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("river jobs still to work after %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	var done int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&done); err != nil {
		return err
	}
	if done != want {
		return fmt.Errorf("%d river jobs completed, want %d", done, want)
	}
	return nil
}

func stepsPerSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// throughputClient runs n steps through a stepready Client in the given dispatch mode.
func throughputClient(ctx context.Context, env *Env, n int, mode string) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadIndependent(ctx, pool, n); err != nil {
		return 0, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	elapsed, err := runClient(ctx, env, pool, reg, mode, n)
	return stepsPerSecond(n, elapsed), err
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct{ river.WorkerDefaults[noopArgs] }

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// throughputRiver is the baseline: River alone working n no-op jobs inserted with InsertMany beforehand.
func throughputRiver(ctx context.Context, env *Env, n int) (float64, error) {
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverBenchWorkers}},
		Workers: workers, Logger: env.Logger.With("component", "river"),
		FetchCooldown: riverBenchFetchCooldown, FetchPollInterval: riverBenchFetchPoll,
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
	err = waitRiver(ctx, pool, n, 10*time.Minute)
	elapsed := time.Since(begin)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = client.Stop(stopCtx)
	return stepsPerSecond(n, elapsed), err
}

// rawWorkers is the number of goroutines of the raw SQL loop: enough to keep both cores of the benchmark machine
// busy while one of them waits on a round trip.
const rawWorkers = 4

// throughputSQL is the ceiling: a tight loop calling only the SQL functions, through their best path and with no
// handler machinery. Each of rawWorkers goroutines claims and starts a batch (claim_and_start_steps, as many as
// the daemon claims at most: dispatch.BatchMax) and completes it (complete_steps): the same statements, fencing,
// events, task status and notifications the daemon's direct dispatch uses, without its goroutines, heartbeats,
// timeouts or batching delays.
func throughputSQL(ctx context.Context, env *Env, n int) (float64, error) {
	pool, _, err := env.NewDB(ctx, 2*rawWorkers)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := loadIndependent(ctx, pool, n); err != nil {
		return 0, err
	}
	begin := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, rawWorkers)
	for w := range rawWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker := fmt.Sprintf("raw-%d", w)
			for {
				started, err := store.ClaimAndStartSteps(ctx, pool, dispatch.BatchMax, worker, 30*time.Second)
				if err != nil {
					errs <- err
					return
				}
				if len(started) == 0 {
					return
				}
				ids := make([]int64, len(started))
				attempts := make([]int, len(started))
				outputs := make([]json.RawMessage, len(started))
				for i, s := range started {
					ids[i], attempts[i], outputs[i] = s.StepID, s.Started.Attempt, s.Input
				}
				done, err := store.CompleteSteps(ctx, pool, ids, attempts, outputs)
				if err != nil {
					errs <- err
					return
				}
				for _, id := range ids {
					if !done[id] {
						errs <- fmt.Errorf("raw SQL loop: step %d was not completed", id)
						return
					}
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
	m, err := medians(
		func() (float64, error) {
			v, err := throughputClient(ctx, env, n, stepready.DispatchDirect)
			return v, wrap("direct", err)
		},
		func() (float64, error) {
			v, err := throughputClient(ctx, env, n, stepready.DispatchRiver)
			return v, wrap("river dispatch", err)
		},
		func() (float64, error) { v, err := throughputRiver(ctx, env, n); return v, wrap("river alone", err) },
		func() (float64, error) { v, err := throughputSQL(ctx, env, n); return v, wrap("raw SQL", err) },
	)
	if err != nil {
		return nil, err
	}
	direct, viaRiver, riverAlone, raw := m[0], m[1], m[2], m[3]
	fig := fmt.Sprintf("%d independent no-op steps", n)
	row := func(name string, v float64, base string, bv float64, target float64) Row {
		return Row{Scenario: "2 throughput", Figure: name + env.Options.label() + ", " + fig, Value: v, Unit: "steps/s",
			Baseline: base,
			BaseVal:  bv, Ratio: v / bv, Target: fmt.Sprintf("ratio >= %.1f", target), Met: boolp(v/bv >= target)}
	}
	return []Row{
		row("(a) direct dispatch", direct, "(c) River alone", riverAlone, 1.0),
		row("(a) direct dispatch", direct, "(d) raw SQL loop", raw, 0.6),
		row("(b) River dispatch", viaRiver, "(c) River alone", riverAlone, 0.5),
	}, nil
}

// wrap prefixes err with what failed (nil stays nil).
func wrap(what string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
