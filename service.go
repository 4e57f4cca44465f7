package stepready

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/dispatch"
	"github.com/stepready/stepready/internal/maintenance"
	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/internal/worker"
	"github.com/stepready/stepready/migrations"
)

// service is a started client: the poller, the listener, the maintenance services and a dispatcher.
type service struct {
	cancelFetch context.CancelFunc // stops claiming and listening
	fetchWG     sync.WaitGroup
	maintainer  *maintenance.Maintainer
	shutdown    func(context.Context) error // drains the dispatcher
	ownPool     *pgxpool.Pool               // the pool opened for poll-only (poolerPool), closed last; or nil
	stopped     chan struct{}
	stopOnce    sync.Once
	stopErr     error
}

// ErrAlreadyStarted is returned by Start on a client that was started before.
var ErrAlreadyStarted = errors.New("stepready: client already started")

// Start starts claiming and working steps. It returns once everything runs; work continues until Stop.
//
// ctx bounds the start only (River's client startup): cancelling it while Start runs aborts the start;
// cancelling it afterwards changes nothing, in either dispatch mode: the client goes on claiming, and running
// attempts are not cancelled. So a program may pass its signal context (signal.NotifyContext) here and call Stop
// when that context ends: Stop then lets running attempts finish within Config.ShutdownGrace before it cancels
// and releases the rest.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.svc != nil {
		return ErrAlreadyStarted
	}
	cfg := c.cfg
	log := cfg.Logger
	// The database must hold this build's schema and functions: refuse now, with what to do, rather than fail on
	// every claim.
	if err := migrations.Check(ctx, c.pool); err != nil {
		return fmt.Errorf("stepready: %w", err)
	}
	svc := &service{stopped: make(chan struct{})}
	pool := c.pool
	if cfg.PollOnly {
		var err error
		if svc.ownPool, err = poolerPool(ctx, c.pool, log); err != nil {
			return err
		}
		if svc.ownPool != nil {
			pool = svc.ownPool
		}
	}
	started := false
	defer func() {
		if !started && svc.ownPool != nil {
			svc.ownPool.Close()
		}
	}()
	m := metrics.New(cfg.Metrics)
	maintainer, err := maintenance.New(maintenance.Config{
		Env:              maintenance.Env{Pool: pool, Logger: log, Metrics: m},
		LeaseReaper:      maintenance.LeaseReaperConfig{Interval: cfg.ReapInterval},
		TaskPruner:       maintenance.TaskPrunerConfig{Interval: cfg.PruneInterval, RetentionComplete: cfg.RetentionComplete, RetentionFailed: cfg.RetentionFailed},
		FlowKeyPruner:    maintenance.FlowKeyPrunerConfig{Interval: cfg.PruneInterval},
		ScheduleEnqueuer: maintenance.ScheduleEnqueuerConfig{Interval: cfg.ScheduleInterval},
		BacklogExporter:  maintenance.BacklogExporterConfig{Interval: cfg.BacklogInterval},
	})
	if err != nil {
		return fmt.Errorf("stepready: %w", err)
	}
	exec := &worker.Executor{Pool: pool, Registry: cfg.Registry, Worker: cfg.WorkerID, Lease: cfg.Lease,
		DefaultTimeout: cfg.DefaultTimeout, MaxOutputBytes: cfg.MaxOutputBytes, Logger: log, Metrics: m}

	// Outcomes are recorded in batches (complete_steps, fail_steps); River's workers, which receive their steps
	// one job at a time, also start them in batches (start_steps). The batchers stop after the dispatcher has
	// drained, so every outcome of a worker that returned is recorded.
	exec.Recorder = worker.NewBatchRecorder(pool, worker.BatchMaxDefault, log)
	svc.maintainer = maintainer
	var disp dispatch.Dispatcher
	switch cfg.Dispatch {
	case DispatchDirect:
		d := dispatch.NewDirect(pool, exec, cfg.Concurrency, cfg.Queues, m)
		disp = d
		svc.shutdown = func(ctx context.Context) error {
			d.Shutdown(ctx)
			exec.Recorder.Stop()
			return nil
		}
	default:
		exec.Starter = worker.NewBatchStarter(pool, cfg.WorkerID, cfg.Lease, worker.BatchMaxDefault, log)
		stopBatchers := func() {
			exec.Starter.Stop()
			exec.Recorder.Stop()
		}
		r, err := dispatch.NewRiver(dispatch.RiverConfig{Pool: pool, Executor: exec,
			Concurrency: cfg.Concurrency, Queues: cfg.Queues, PollOnly: cfg.PollOnly, PollInterval: cfg.PollInterval, Logger: log, Metrics: m})
		if err != nil {
			stopBatchers()
			return err
		}
		if err := r.Start(ctx); err != nil {
			stopBatchers()
			return fmt.Errorf("stepready: start river: %w", err)
		}
		disp = r
		svc.shutdown = func(ctx context.Context) error {
			err := r.Shutdown(ctx)
			stopBatchers()
			return err
		}
	}

	fetchCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	svc.cancelFetch = cancel
	wake := make(chan struct{}, 1)
	run := func(name string, f func(context.Context) error) {
		svc.fetchWG.Add(1)
		go func() {
			defer svc.fetchWG.Done()
			if err := f(fetchCtx); err != nil {
				log.Error("stepready: "+name+" stopped", slog.Any("error", err))
			}
		}()
	}
	if !cfg.PollOnly {
		l := &dispatch.Listener{ConnConfig: pool.Config().ConnConfig.Copy(), Wake: wake, Logger: log}
		run("listener", l.Run)
	}
	p := &dispatch.Poller{DB: pool, Dispatcher: disp, Wake: wake, PollInterval: cfg.PollInterval, Logger: log,
		ProbeInterval: cfg.ProbeInterval} // Off (-1): no probing
	if cfg.Dispatch == DispatchDirect {
		// Two batches in flight: one is claimed while the other runs and is recorded.
		p.ClaimMax = max((cfg.Concurrency+1)/2, 1)
	}
	run("poller", p.Run)
	if err := maintainer.Start(fetchCtx); err != nil {
		cancel()
		svc.fetchWG.Wait()
		_ = svc.shutdown(ctx)
		return fmt.Errorf("stepready: start maintenance: %w", err)
	}

	c.svc = svc
	started = true
	log.Info("stepready: client started", slog.String("worker", cfg.WorkerID), slog.String("dispatch", cfg.Dispatch),
		slog.Int("concurrency", cfg.Concurrency), slog.Any("queues", cfg.Queues),
		slog.Any("handlers", cfg.Registry.Names()), slog.Duration("lease", cfg.Lease),
		slog.Bool("poll_only", cfg.PollOnly),
		slog.String("query_exec_mode", pool.Config().ConnConfig.DefaultQueryExecMode.String()))
	return nil
}

// poolerPool returns, for Config.PollOnly, a pool that works through a transaction pooler: nil when pool
// already does (its URL names default_query_exec_mode, or its configuration sets a mode other than pgx's
// default), else a new pool with pool's configuration (its connection string, limits and hooks) in
// store.PoolerQueryExecMode. The client uses it for everything, River's client included, and closes it
// when it stops; pool stays the caller's.
func poolerPool(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg := pool.Config()
	if !store.UsePoolerQueryMode(cfg.ConnConfig) {
		return nil, nil
	}
	own, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("stepready: poll-only: open a pool in query mode %s: %w", store.PoolerQueryExecMode, err)
	}
	log.Info("stepready: poll-only: the client's queries prepare no named statement, on a pool of its own",
		slog.String("query_exec_mode", store.PoolerQueryExecMode.String()))
	return own, nil
}

// Stop shuts the client down gracefully: it stops claiming, lets running attempts finish for up to
// Config.ShutdownGrace (or until ctx is done, whichever comes first), then cancels the rest and hands them back
// uncharged with release_step. It returns when every outcome is recorded. Stop is idempotent; a client that was
// never started stops at once.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	svc := c.svc
	c.mu.Unlock()
	if svc == nil {
		return nil
	}
	svc.stopOnce.Do(func() {
		log := c.cfg.Logger
		log.Info("stepready: stopping: no new claims; waiting for running attempts",
			slog.Duration("grace", c.cfg.ShutdownGrace))
		svc.cancelFetch()
		svc.fetchWG.Wait()
		svc.maintainer.Stop()
		grace, cancel := context.WithTimeout(ctx, max(c.cfg.ShutdownGrace, 0))
		defer cancel()
		svc.stopErr = svc.shutdown(grace)
		if svc.ownPool != nil {
			svc.ownPool.Close()
		}
		log.Info("stepready: client stopped")
		close(svc.stopped)
	})
	<-svc.stopped
	return svc.stopErr
}

// Stopped is closed once Stop has finished. Nil before Start.
func (c *Client) Stopped() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.svc == nil {
		return nil
	}
	return c.svc.stopped
}
