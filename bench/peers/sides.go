package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/migrations"
	"github.com/stepready/stepready/steps"
)

// The same work on both sides: no-op steps; a run is a task (stepready) or a workflow (DBOS).

// Definitions of stepready's runs.
var (
	oneStepDef = json.RawMessage(`{"name": "one", "steps": [{"name": "a", "handler": "noop"}]}`)
	chainDef   = json.RawMessage(`{"name": "chain", "steps": [{"name": "s1", "handler": "noop"},
		{"name": "s2", "handler": "noop", "depends_on": ["s1"]}, {"name": "s3", "handler": "noop", "depends_on": ["s2"]},
		{"name": "s4", "handler": "noop", "depends_on": ["s3"]}]}`)
	signalDef = json.RawMessage(`{"name": "signal", "steps": [{"name": "w", "wait": {"signal": "go"}},
		{"name": "after", "handler": "mark", "depends_on": ["w"]}]}`)
	fanOutDef = func() json.RawMessage {
		var b strings.Builder
		b.WriteString(`{"name": "fan", "steps": [`)
		deps := make([]string, 100)
		for i := range 100 {
			fmt.Fprintf(&b, `{"name": "p%d", "handler": "noop"},`, i)
			deps[i] = fmt.Sprintf(`"p%d"`, i)
		}
		b.WriteString(`{"name": "join", "handler": "noop", "depends_on": [` + strings.Join(deps, ",") + `]}]}`)
		return json.RawMessage(b.String())
	}()
)

// marks receives the instant the step after a signal started, on both sides (one signal at a time).
var marks = make(chan time.Time, 16)

// srSide is stepready on its own database.
type srSide struct {
	url    string
	pool   *pgxpool.Pool
	reg    *steps.Registry
	client *stepready.Client
	logger *slog.Logger
}

func newSR(ctx context.Context, e *env) (*srSide, error) {
	url, err := e.newDB(ctx, "stepready")
	if err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, url, nil); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 2*producers + concurrency + 10
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) { return nil, nil }))
	reg.MustRegister("mark", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
		select {
		case marks <- time.Now():
		default:
		}
		return nil, nil
	}))
	return &srSide{url: url, pool: pool, reg: reg, logger: e.logger.With("side", "stepready")}, nil
}

// start starts a stepready client (the daemon's work: claims, River, workers) with the defaults but concurrency.
func (s *srSide) start(ctx context.Context) error {
	c, err := stepready.NewClient(s.pool, stepready.Config{Registry: s.reg, Concurrency: concurrency, Logger: s.logger})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	s.client = c
	return nil
}

func (s *srSide) stop() {
	if s.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.client.Stop(ctx)
		s.client = nil
	}
}

func (s *srSide) close() {
	s.stop()
	s.pool.Close()
}

// create creates one task with the library (which wakes the daemons after its commit).
func (s *srSide) create(ctx context.Context, def json.RawMessage) (int64, error) {
	return stepready.CreateTask(ctx, s.pool, def)
}

// idle says whether no step is left to run (every task created so far has ended): two probes of partial indexes.
func (s *srSide) idle(ctx context.Context) (bool, error) {
	var busy bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stepready.steps WHERE state IN ('enqueued', 'in_progress'))
		OR EXISTS (SELECT 1 FROM stepready.steps
		            WHERE state IN ('pending', 'waiting_for_retry') AND pending_parents = 0 AND NOT task_held)`).Scan(&busy)
	return !busy, err
}

// dbSide is DBOS on its own database.
type dbSide struct {
	url    string
	pool   *pgxpool.Pool
	dctx   dbos.Context
	client dbos.Client
	queue  dbos.Queue
	logger *slog.Logger
}

const dbosQueue = "peers"

// dbosQueuePoll is the DBOS queues' base polling interval. DBOS's queue runner finds enqueued work by polling
// only (default 1 s), at most the worker concurrency per poll: with the default a queue of concurrency 10 drains
// about 10 runs a second. 10 ms lets it run at its database's pace, which is what this benchmark compares (and is
// kinder to DBOS than stepready's 25 ms probe of the wake-up counter, which only matters for work announced by
// no NOTIFY).
const dbosQueuePoll = 10 * time.Millisecond

// The DBOS workflows, registered by name so that a client can enqueue them.
func dbNoop(ctx dbos.Context, _ string) (string, error) {
	return dbos.RunAsStep(ctx, func(context.Context) (string, error) { return "", nil }, dbos.WithStepName("a"))
}

func dbChain(ctx dbos.Context, _ string) (string, error) {
	for i := range 4 {
		if _, err := dbos.RunAsStep(ctx, func(context.Context) (string, error) { return "", nil },
			dbos.WithStepName(fmt.Sprintf("s%d", i+1))); err != nil {
			return "", err
		}
	}
	return "", nil
}

func dbSignal(ctx dbos.Context, _ string) (string, error) {
	if _, err := dbos.Recv[string](ctx, "go", time.Hour); err != nil {
		return "", err
	}
	return dbos.RunAsStep(ctx, func(context.Context) (string, error) {
		select {
		case marks <- time.Now():
		default:
		}
		return "", nil
	}, dbos.WithStepName("after"))
}

// dbFanQueue is the queue the fan-out's children run on (set before launch).
var dbFanQueue dbos.Queue

func dbFanOut(ctx dbos.Context, _ string) (string, error) {
	handles := make([]dbos.WorkflowHandle[string], 100)
	for i := range handles {
		h, err := dbos.RunWorkflow(ctx, dbNoop, "", dbos.WithQueue(dbFanQueue))
		if err != nil {
			return "", err
		}
		handles[i] = h
	}
	for _, h := range handles {
		if _, err := h.GetResult(); err != nil {
			return "", err
		}
	}
	return dbos.RunAsStep(ctx, func(context.Context) (string, error) { return "", nil }, dbos.WithStepName("join"))
}

// newDBOS makes a database for DBOS and migrates it (a context launched without queues, then shut down), and
// returns a side with a client (enqueue) and no executor running.
func newDBOS(ctx context.Context, e *env) (*dbSide, error) {
	url, err := e.newDB(ctx, "dbos")
	if err != nil {
		return nil, err
	}
	logger := e.logger.With("side", "dbos")
	quiet := slog.New(slog.NewTextHandler(discard{}, nil))
	if e.verbose {
		quiet = logger
	}
	d, err := dbos.NewContext(ctx, dbos.Config{DatabaseURL: url, AppName: "peers", Logger: quiet})
	if err != nil {
		return nil, fmt.Errorf("dbos: %w", err)
	}
	registerDBOS(d)
	if err := dbos.Launch(d); err != nil {
		return nil, fmt.Errorf("dbos: launch: %w", err)
	}
	_ = dbos.Shutdown(d, 10*time.Second)
	client, err := dbos.NewClient(ctx, dbos.ClientConfig{DatabaseURL: url, AppName: "peers", Logger: quiet})
	if err != nil {
		return nil, fmt.Errorf("dbos: client: %w", err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	return &dbSide{url: url, pool: pool, client: client, logger: logger}, nil
}

func registerDBOS(d dbos.Context) {
	dbos.RegisterWorkflow(d, dbNoop, dbos.WithWorkflowName("noop"))
	dbos.RegisterWorkflow(d, dbChain, dbos.WithWorkflowName("chain"))
	dbos.RegisterWorkflow(d, dbSignal, dbos.WithWorkflowName("signal"))
	dbos.RegisterWorkflow(d, dbFanOut, dbos.WithWorkflowName("fan"))
}

// start launches an executor with the queue (worker concurrency = concurrency), as a DBOS application runs.
func (s *dbSide) start(ctx context.Context) error {
	quiet := slog.New(slog.NewTextHandler(discard{}, nil))
	d, err := dbos.NewContext(ctx, dbos.Config{DatabaseURL: s.url, AppName: "peers", Logger: quiet})
	if err != nil {
		return err
	}
	registerDBOS(d)
	q, err := dbos.RegisterQueue(d, dbosQueue, dbos.WithWorkerConcurrency(concurrency), dbos.WithQueueBasePollingInterval(dbosQueuePoll))
	if err != nil {
		return err
	}
	fq, err := dbos.RegisterQueue(d, dbosQueue+"_fan", dbos.WithWorkerConcurrency(concurrency), dbos.WithQueueBasePollingInterval(dbosQueuePoll))
	if err != nil {
		return err
	}
	dbFanQueue = fq
	if err := dbos.Launch(d); err != nil {
		return err
	}
	s.dctx, s.queue = d, q
	return nil
}

func (s *dbSide) stop() {
	if s.dctx != nil {
		_ = dbos.Shutdown(s.dctx, 30*time.Second)
		s.dctx = nil
	}
}

func (s *dbSide) close() {
	s.stop()
	_ = dbos.Shutdown(s.client, 10*time.Second)
	s.pool.Close()
}

// enqueue enqueues one run of workflow name on the queue through the client.
func (s *dbSide) enqueue(name string) error {
	_, err := dbos.Enqueue[string](s.client, dbosQueue, name, "")
	return err
}

// statuses counts the workflows by status (for an error message).
func (s *dbSide) statuses(ctx context.Context) string {
	rows, err := s.pool.Query(ctx, `SELECT status || ' ' || count(*) FROM dbos.workflow_status GROUP BY status`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var x string
		_ = rows.Scan(&x)
		out = append(out, x)
	}
	return strings.Join(out, ", ")
}

// idle says whether no workflow is left enqueued or running.
func (s *dbSide) idle(ctx context.Context) (bool, error) {
	var busy bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM dbos.workflow_status
		WHERE status IN ('ENQUEUED', 'PENDING'))`).Scan(&busy)
	return !busy, err
}

// waitIdle polls idle every 10 ms until it holds or limit passes.
func waitIdle(ctx context.Context, idle func(context.Context) (bool, error), limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := idle(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("runs still unfinished after %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// produce runs producers goroutines calling one until window passes (window > 0) or n calls were made in all
// (window 0), and returns the number of calls and the time taken.
func produce(ctx context.Context, window time.Duration, n int, one func() error) (int, time.Duration, error) {
	var mu sync.Mutex
	var firstErr error
	count := 0
	begin := time.Now()
	var wg sync.WaitGroup
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				stop := firstErr != nil || (window > 0 && time.Since(begin) >= window) || (window == 0 && count >= n)
				if !stop {
					count++
				}
				mu.Unlock()
				if stop {
					return
				}
				if err := one(); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return count, time.Since(begin), firstErr
}

// discard is an io.Writer that drops everything (DBOS logs at info by default).
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
