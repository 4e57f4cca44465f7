package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepready/stepready"
)

// creationBatch is the number of chains per create_tasks call in scenario 7b.
const creationBatch = 100

// creationLoadBatch is the number of chains per create_tasks call when scenario 7 fills a database.
const creationLoadBatch = 1000

// riverFileChunk is how many jobs each InsertManyFastTx call of scenario 7c's baseline inserts.
const riverFileChunk = 100_000

// chainBatch returns a JSON array of n chain definitions.
func chainBatch(n int) string {
	defs := make([]json.RawMessage, n)
	for i := range defs {
		defs[i] = chainDefinition
	}
	b, _ := json.Marshal(defs)
	return string(b)
}

// creation is scenario 7, creating tasks:
//
//   - 7a: create_task of a 4-step chain, one per statement, one client, on a freshly migrated database whose task
//     tables are never analyzed (autovacuum off for them): p50 latency, and the tasks created in the last sixth
//     of the run over the first (a plan made for the tables' first, tiny state would slow creation as they
//     grow); then again, for half as long, after size.CreationLoaded chains were bulk-loaded with autovacuum
//     on and autovacuum has analyzed the tables (statistics taken mid-load, the state that made JIT compile
//     the edge trigger in issue 20);
//   - 7b: create_tasks in batches of 100 chains from 2 clients, in steps/s, against a multi-row INSERT of as
//     many river_job rows per statement (the shape of River's InsertMany) from 2 clients, each measured three
//     times interleaved (medians), on an empty database and after size.CreationLoaded chains;
//   - 7c: size.CreationFileChains chains from a JSON-lines file through `scheduler task create -f` (a child
//     process): wall time and the child's peak resident set, against River's InsertManyFastTx (COPY) of four
//     jobs per chain in one transaction.
func creation(ctx context.Context, env *Env, size Size) ([]Row, error) {
	rows, err := creationSingle(ctx, env, size)
	if err != nil {
		return nil, err
	}
	bulk, err := creationBulk(ctx, env, size)
	if err != nil {
		return nil, err
	}
	file, err := creationFile(ctx, env, size)
	if err != nil {
		return nil, err
	}
	return append(append(rows, bulk...), file...), nil
}

// taskTables are the tables a task's creation writes.
var taskTables = []string{"tasks", "steps", "step_edges"}

// creationSingle is 7a.
func creationSingle(ctx context.Context, env *Env, size Size) ([]Row, error) {
	pool, _, err := env.NewDB(ctx, 4)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// Never analyzed for the first run: autovacuum would otherwise analyze the growing tables and hide a plan
	// that only suits an empty table.
	for _, table := range taskTables {
		if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE stepready.%s SET (autovacuum_enabled = off)`, table)); err != nil {
			return nil, err
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	window := size.CreationRun / 6
	lat, first, last, err := createTaskLoop(ctx, conn, size.CreationRun, window)
	if err != nil {
		return nil, err
	}
	trip, err := selectOneP50(ctx, conn)
	if err != nil {
		return nil, err
	}
	floor, err := insertOneP50(ctx, conn)
	if err != nil {
		return nil, err
	}
	p50 := median(lat)
	rate := float64(last) / float64(max(first, 1))
	label := env.Options.label()
	rows := []Row{
		{Scenario: "7a creation", Figure: "create_task of a 4-step chain, one client: p50 latency" + label, Value: millis(p50),
			Unit: "ms", Baseline: "SELECT 1 round trip", BaseVal: millis(trip), Ratio: float64(p50) / float64(trip),
			Target: "<= 1 ms", Met: boolp(p50 <= time.Millisecond)},
		{Scenario: "7a creation", Figure: "context: a one-row INSERT into river_job, one per statement: p50 (what a committed " +
			"write costs on this cluster)" + label, Value: millis(floor), Unit: "ms", Target: "(reported)"},
		{Scenario: "7a creation", Figure: fmt.Sprintf("tasks created in the last %s over the first %s of %s, never analyzed (%d tasks)%s",
			window, window, size.CreationRun, len(lat), label), Value: rate, Unit: "×", Target: ">= 0.8", Met: boolp(rate >= 0.8)},
	}

	// The same after a bulk load, with autovacuum on and run.
	for _, table := range taskTables {
		if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE stepready.%s RESET (autovacuum_enabled)`, table)); err != nil {
			return nil, err
		}
	}
	loaded, err := loadChains(ctx, pool, size.CreationLoaded)
	if err != nil {
		return nil, err
	}
	ran, err := waitAutovacuum(ctx, pool, loaded, 4*time.Minute)
	if err != nil {
		return nil, err
	}
	lat, _, _, err = createTaskLoop(ctx, conn, size.CreationRun/2, 0)
	if err != nil {
		return nil, err
	}
	if trip, err = selectOneP50(ctx, conn); err != nil {
		return nil, err
	}
	p50 = median(lat)
	rows = append(rows, Row{Scenario: "7a creation", Figure: fmt.Sprintf(
		"create_task p50 after %d chains bulk-loaded, %s%s", size.CreationLoaded, ran, label), Value: millis(p50),
		Unit: "ms", Baseline: "SELECT 1 round trip", BaseVal: millis(trip), Ratio: float64(p50) / float64(trip),
		Target: "<= 1.2 ms", Met: boolp(p50 <= 1200*time.Microsecond)})
	return rows, nil
}

// createTaskLoop calls create_task one chain per statement for d and returns the latencies, and how many calls
// ended within the first and the last window.
func createTaskLoop(ctx context.Context, conn *pgxpool.Conn, d, window time.Duration) ([]time.Duration, int, int, error) {
	var lat []time.Duration
	var first, last int
	begin := time.Now()
	for time.Since(begin) < d {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`, string(chainDefinition)); err != nil {
			return nil, 0, 0, fmt.Errorf("create_task: %w", err)
		}
		lat = append(lat, time.Since(t0))
		switch at := time.Since(begin); {
		case window == 0:
		case at <= window:
			first++
		case at > d-window:
			last++
		}
	}
	return lat, first, last, nil
}

// selectOneP50 is the median round trip of SELECT 1 on conn.
func selectOneP50(ctx context.Context, conn *pgxpool.Conn) (time.Duration, error) {
	var trips []time.Duration
	for range 500 {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
			return 0, err
		}
		trips = append(trips, time.Since(t0))
	}
	return median(trips), nil
}

// insertOneP50 is the median time of a one-row INSERT into river_job committed on its own, on conn: the least a
// committed write costs on the cluster (with the server's defaults, the WAL flush of the commit).
func insertOneP50(ctx context.Context, conn *pgxpool.Conn) (time.Duration, error) {
	var lat []time.Duration
	for range 500 {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state, tags)
			VALUES ('{"step_id": 1}', 'stepready_step', 1, 1, 'default', now(), 'available', '{}')`); err != nil {
			return 0, err
		}
		lat = append(lat, time.Since(t0))
	}
	return median(lat), nil
}

// loadChains creates n chains through stepready.CreateTasks in batches of creationLoadBatch and returns when
// it finished.
func loadChains(ctx context.Context, pool *pgxpool.Pool, n int) (time.Time, error) {
	defs := make([]json.RawMessage, creationLoadBatch)
	for i := range defs {
		defs[i] = chainDefinition
	}
	for done := 0; done < n; done += creationLoadBatch {
		if _, err := stepready.CreateTasks(ctx, pool, defs[:min(creationLoadBatch, n-done)]); err != nil {
			return time.Time{}, fmt.Errorf("load chains: %w", err)
		}
	}
	var now time.Time
	err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// waitAutovacuum waits until autovacuum has analyzed every task table since after, and no autovacuum worker is
// busy in the database any more (at most limit), and says what it saw, for the figure.
func waitAutovacuum(ctx context.Context, pool *pgxpool.Pool, after time.Time, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		var analyzed int
		var busy bool
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_catalog.pg_stat_user_tables
			WHERE schemaname = 'stepready' AND relname = ANY ($1) AND last_autoanalyze > $2),
			EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity
			         WHERE backend_type = 'autovacuum worker' AND datname = current_database())`, taskTables, after).
			Scan(&analyzed, &busy); err != nil {
			return "", err
		}
		if analyzed == len(taskTables) && !busy {
			return "autovacuum having analyzed the tables and finished", nil
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("autovacuum had analyzed %d of the 3 tables after %s", analyzed, limit), nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// creationBulk is 7b.
func creationBulk(ctx context.Context, env *Env, size Size) ([]Row, error) {
	pool, _, err := env.NewDB(ctx, 4)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	batch := chainBatch(creationBatch)
	bulkOnce := func() (float64, error) {
		return ratePerClient(ctx, pool, 2, size.CreationBulkRun/repeatRuns, func(ctx context.Context, c *pgxpool.Conn) (int, error) {
			rows, err := c.Query(ctx, `SELECT count(*) FROM stepready.create_tasks($1::jsonb)`, batch)
			if err != nil {
				return 0, err
			}
			rows.Close()
			return 4 * creationBatch, rows.Err()
		})
	}
	args := make([]string, 4*creationBatch)
	for i := range args {
		args[i] = fmt.Sprintf(`{"step_id": %d, "claimed_at": "2026-11-24T00:00:00Z"}`, i)
	}
	riverOnce := func() (float64, error) {
		return ratePerClient(ctx, pool, 2, size.CreationBulkRun/repeatRuns, func(ctx context.Context, c *pgxpool.Conn) (int, error) {
			_, err := c.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state, tags)
				SELECT a, 'stepready_step', 1, 1, 'default', now(), 'available', '{}'
				  FROM unnest($1::jsonb[]) AS a`, args)
			return len(args), err
		})
	}
	var rows []Row
	for _, state := range []string{"empty database", fmt.Sprintf("after %d chains", size.CreationLoaded)} {
		if len(rows) > 0 {
			if _, err := loadChains(ctx, pool, size.CreationLoaded); err != nil {
				return nil, err
			}
		}
		rates, err := medians(bulkOnce, riverOnce)
		if err != nil {
			return nil, fmt.Errorf("7b: %w", err)
		}
		ratio := rates[0] / rates[1]
		rows = append(rows, Row{Scenario: "7b bulk creation", Figure: fmt.Sprintf(
			"create_tasks, batches of %d 4-step chains, 2 clients, %s%s", creationBatch, state, env.Options.label()),
			Value: rates[0], Unit: "steps/s", Baseline: "river_job multi-row INSERT", BaseVal: rates[1], Ratio: ratio,
			Target: ">= 0.5 (at least 0.3)", Met: boolp(ratio >= 0.5)})
	}
	return rows, nil
}

// creationFile is 7c.
func creationFile(ctx context.Context, env *Env, size Size) ([]Row, error) {
	bin, dir, remove, err := buildScheduler(ctx)
	if err != nil {
		return nil, err
	}
	defer remove()
	file := filepath.Join(dir, "chains.jsonl")
	if err := writeChainLines(file, size.CreationFileChains); err != nil {
		return nil, err
	}

	pool, url, err := env.NewDB(ctx, 2)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "task", "create", "-f", file, "--database-url", url, "--output", "json")
	var stderr tailBuffer
	cmd.Stderr = &stderr
	begin := time.Now()
	if err := cmd.Run(); err != nil {
		pool.Close()
		return nil, fmt.Errorf("scheduler task create -f: %w: %s", err, stderr.String())
	}
	wall := time.Since(begin)
	peak := int64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) * 1024 // KiB on Linux
	var created int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&created)
	pool.Close()
	if err != nil {
		return nil, err
	}
	if created != size.CreationFileChains {
		return nil, fmt.Errorf("scheduler task create -f created %d tasks of %d", created, size.CreationFileChains)
	}

	riverWall, err := riverInsertFast(ctx, env, 4*size.CreationFileChains)
	if err != nil {
		return nil, fmt.Errorf("the baseline, river InsertManyFastTx: %w", err)
	}
	steps := float64(4*size.CreationFileChains) / wall.Seconds()
	jobs := float64(4*size.CreationFileChains) / riverWall.Seconds()
	label := env.Options.label()
	return []Row{
		{Scenario: "7c file creation", Figure: fmt.Sprintf("`scheduler task create -f` of %d chains (JSON lines), wall time %.1f s%s",
			size.CreationFileChains, wall.Seconds(), label), Value: steps, Unit: "steps/s",
			Baseline: fmt.Sprintf("River InsertManyFastTx (COPY) of %d jobs, %.1f s", 4*size.CreationFileChains, riverWall.Seconds()),
			BaseVal:  jobs, Ratio: steps / jobs, Target: ">= 0.3", Met: boolp(steps/jobs >= 0.3)},
		{Scenario: "7c file creation", Figure: fmt.Sprintf("peak RSS of `scheduler task create -f`, %d chains%s",
			size.CreationFileChains, label), Value: megabytes(peak), Unit: "MB", Target: "<= 100 MB",
			Met: boolp(peak <= 100_000_000)},
	}, nil
}

// writeChainLines writes n chain definitions, one per line, each with its own idempotency key (as a load that
// may be resumed would have).
func writeChainLines(file string, n int) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var compact bytes.Buffer
	if err := json.Compact(&compact, chainDefinition); err != nil {
		return err
	}
	body := compact.Bytes()[1:] // after the opening brace
	for i := range n {
		fmt.Fprintf(w, `{"idempotency_key": "chain-%d", %s`+"\n", i, body)
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// fileJobArgs are the args of the jobs of scenario 7c's baseline: what stepready's River dispatch puts in a job.
type fileJobArgs struct {
	StepID    int64     `json:"step_id"`
	ClaimedAt time.Time `json:"claimed_at"`
}

func (fileJobArgs) Kind() string { return "stepready_step" }

// riverInsertFast inserts n jobs with River's InsertManyFastTx (COPY) in chunks of riverFileChunk, in one
// transaction, on a fresh database, and returns the time it took (building the jobs included).
func riverInsertFast(ctx context.Context, env *Env, n int) (time.Duration, error) {
	pool, _, err := env.NewDB(ctx, 2)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: env.Logger.With("component", "river")})
	if err != nil {
		return 0, err
	}
	claimed := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	begin := time.Now()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for done := 0; done < n; done += riverFileChunk {
			params := make([]river.InsertManyParams, min(riverFileChunk, n-done))
			for i := range params {
				params[i] = river.InsertManyParams{Args: fileJobArgs{StepID: int64(done + i), ClaimedAt: claimed}}
			}
			if _, err := client.InsertManyFastTx(ctx, tx, params); err != nil {
				return err
			}
		}
		return nil
	})
	elapsed := time.Since(begin)
	if err != nil {
		return 0, err
	}
	var jobs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job`).Scan(&jobs); err != nil {
		return 0, err
	}
	if jobs != n {
		return 0, fmt.Errorf("%d jobs inserted of %d", jobs, n)
	}
	return elapsed, nil
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
