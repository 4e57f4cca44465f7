package stepready

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/readiness"
	"github.com/stepready/stepready/schedules"
	"github.com/stepready/stepready/steps"
)

// service is a started client: the poller, the listener, the reaper, the schedule leader and a dispatcher.
type service struct {
	cancelFetch context.CancelFunc // stops claiming, listening and reaping
	fetchWG     sync.WaitGroup
	shutdown    func(context.Context) error // drains the dispatcher
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
	m := metrics.New(cfg.Metrics)
	exec := &steps.Executor{Pool: c.pool, Registry: cfg.Registry, Worker: cfg.WorkerID, Lease: cfg.Lease,
		DefaultTimeout: cfg.DefaultTimeout, MaxOutputBytes: cfg.MaxOutputBytes, Logger: log, Metrics: m}

	// Outcomes are recorded in batches (complete_steps, fail_steps); River's workers, which receive their steps
	// one job at a time, also start them in batches (start_steps). The batchers stop after the dispatcher has
	// drained, so every outcome of a worker that returned is recorded.
	exec.Recorder = steps.NewBatchRecorder(c.pool, steps.BatchMaxDefault, log)
	svc := &service{stopped: make(chan struct{})}
	var disp readiness.Dispatcher
	switch cfg.Dispatch {
	case DispatchDirect:
		d := readiness.NewDirect(c.pool, exec, cfg.Concurrency, m)
		disp = d
		svc.shutdown = func(ctx context.Context) error {
			d.Shutdown(ctx)
			exec.Recorder.Stop()
			return nil
		}
	default:
		exec.Starter = steps.NewBatchStarter(c.pool, cfg.WorkerID, cfg.Lease, steps.BatchMaxDefault, log)
		stopBatchers := func() {
			exec.Starter.Stop()
			exec.Recorder.Stop()
		}
		r, err := readiness.NewRiver(readiness.RiverConfig{Pool: c.pool, Executor: exec,
			Concurrency: cfg.Concurrency, PollOnly: cfg.PollOnly, Logger: log, Metrics: m})
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
		l := &readiness.Listener{ConnConfig: c.pool.Config().ConnConfig.Copy(), Wake: wake, Logger: log}
		run("listener", l.Run)
	}
	p := &readiness.Poller{DB: c.pool, Dispatcher: disp, Wake: wake, PollInterval: cfg.PollInterval, Logger: log}
	if cfg.Dispatch == DispatchDirect {
		// Two batches in flight: one is claimed while the other runs and is recorded.
		p.ClaimMax = max((cfg.Concurrency+1)/2, 1)
	}
	run("poller", p.Run)
	rp := &readiness.Reaper{Pool: c.pool, Interval: cfg.ReapInterval, Logger: log, Metrics: m}
	run("reaper", rp.Run)
	pr := &readiness.Pruner{Pool: c.pool, Interval: cfg.PruneInterval, RetentionComplete: cfg.RetentionComplete,
		RetentionFailed: cfg.RetentionFailed, Logger: log, Metrics: m}
	run("pruner", pr.Run)
	sl := &schedules.Leader{Pool: c.pool, Logger: log, Metrics: schedules.NewMetrics(cfg.Metrics)}
	run("schedule leader", sl.Run)

	c.svc = svc
	log.Info("stepready: client started", slog.String("worker", cfg.WorkerID), slog.String("dispatch", cfg.Dispatch),
		slog.Int("concurrency", cfg.Concurrency), slog.Duration("lease", cfg.Lease),
		slog.Bool("poll_only", cfg.PollOnly))
	return nil
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
		grace, cancel := context.WithTimeout(ctx, c.cfg.ShutdownGrace)
		defer cancel()
		svc.stopErr = svc.shutdown(grace)
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
