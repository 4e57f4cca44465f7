package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/migrations"
)

// runParams are the resolved flags of `scheduler run`.
type runParams struct {
	databaseURL string
	metricsAddr string
	uiAddr      string
	uiActions   uiActionFlags
	allowExec   bool
	// waitForDB bounds the wait for the database at start (--wait-for-db).
	waitForDB waitBound
	daemon    daemonFlags
}

// newRunCommand builds `scheduler run`, the daemon.
func newRunCommand(opts *globalOptions) *cobra.Command {
	p := &runParams{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the scheduler daemon: claim ready steps, dispatch them, run their handlers, record the outcomes",
		Long: "Run the scheduler daemon until SIGINT or SIGTERM. It claims ready steps (woken by LISTEN on\n" +
			"stepready_ready, by the earliest pending retry and by --poll-interval), dispatches them through River or\n" +
			"its own worker pool, runs their handlers with the built-in handlers (noop, sleep, fail, http, sql, exec)\n" +
			"and records every outcome in the database. At the first signal it stops claiming, lets running attempts\n" +
			"finish for up to --shutdown-grace, then hands the rest back uncharged; a second signal exits at once.\n\n" +
			"At start it waits for the database (--wait-for-db, default forever), trying again with backoff and\n" +
			"logging each failure; meanwhile --metrics-addr and --ui-addr listen and /healthz answers 503.\n\n" +
			"Every flag also reads the environment variable shown with it; a flag on the command line wins.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.daemon.validate(); err != nil {
				return err
			}
			if _, err := p.uiActions.options(nil); err != nil {
				return err
			}
			if _, err := opts.logger(); err != nil {
				return err
			}
			url, err := databaseURL(p.databaseURL)
			if err != nil {
				return err
			}
			p.databaseURL = url
			run := opts.daemon
			if run == nil {
				run = opts.runDaemon
			}
			return run(cmd.Context(), p)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&p.databaseURL, "database-url", "", "PostgreSQL URL of the stepready database (migrated)")
	setDefaultText(fs, "database-url", "none")
	p.daemon.register(fs, stepready.DispatchRiver)
	fs.StringVar(&p.metricsAddr, "metrics-addr", "",
		"listen address (host:port) of the HTTP server with /metrics (Prometheus) and /healthz; empty: none")
	fs.StringVar(&p.uiAddr, "ui-addr", "", "listen address (host:port) of the web console; empty: none")
	p.uiActions.register(fs)
	fs.BoolVar(&p.allowExec, "allow-exec", false,
		"enable the exec handler: steps may run programs on this host as this user")
	registerWaitFlag(fs, &p.waitForDB)
	return cmd
}

// runDaemon runs the client until ctx ends (SIGINT/SIGTERM), then stops it gracefully. At start, the HTTP
// listeners come up first (answering 503 on /healthz), then it waits for the database (--wait-for-db). Teardown is
// ordered: stop claiming, drain and release attempts (Client.Stop), close the pool, and the health server last.
func (o *globalOptions) runDaemon(ctx context.Context, p *runParams) error {
	logger, err := o.logger()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var health *healthServer
	if p.metricsAddr != "" {
		// Before anything else: a busy port fails at once.
		if health, err = startHealthServer(p.metricsAddr, registry, logger); err != nil {
			return err
		}
		defer health.close()
	}
	copts, err := p.uiActions.options(logger)
	if err != nil {
		return err
	}
	copts.Registerer = registry // the console's signal sends on this process's /metrics
	pool, err := newPool(ctx, p.databaseURL, daemonPoolSize(p.daemon.concurrency), p.daemon.pollOnly)
	if err != nil {
		return err
	}
	defer pool.Close()
	stopUI := func() error { return nil }
	var ui *consoleServer
	if p.uiAddr != "" {
		if ui, err = listenConsole(ctx, p.uiAddr, logger); err != nil {
			return err
		}
		stopUI = ui.stop
		logger.Info("scheduler: console listening", slog.String("url", ui.url))
	}

	if err := waitForDatabase(ctx, pool, p.waitForDB, logger); err != nil {
		_ = stopUI()
		if errors.Is(err, errStoppedWaiting) {
			logger.Info("scheduler: " + err.Error())
			return nil
		}
		return err
	}
	if err := checkSchema(ctx, pool); err != nil {
		_ = stopUI()
		return err
	}
	if ui != nil {
		if err := ui.attach(pool, copts); err != nil {
			_ = stopUI()
			return err
		}
	}
	health.setStatus(healthStarting)
	client, err := startClient(ctx, pool, &p.daemon, p.allowExec, logger, registry)
	if err != nil {
		_ = stopUI()
		if ctx.Err() != nil {
			logger.Info("scheduler: stopped while starting", slog.Any("error", err))
			return nil
		}
		return err
	}
	disarm := o.watchSignals()
	defer disarm()
	health.setStatus(healthRunning)
	logger.Info("scheduler: running; SIGINT or SIGTERM stops it", slog.String("dispatch", client.Config().Dispatch),
		slog.String("worker", client.Config().WorkerID))
	waitWatch := watchSchema(ctx, pool, health, logger, schemaWatchInterval)

	<-ctx.Done()
	waitWatch()
	health.setStatus(healthStopping)
	if err := stopUI(); err != nil {
		logger.Warn("scheduler: console stop", slog.Any("error", err))
	}
	// Stop is bounded by the shutdown grace, then by recording the released attempts: it must not be cut short
	// by the context that just ended.
	stopErr := client.Stop(context.WithoutCancel(ctx))
	pool.Close()
	health.close()
	if stopErr != nil {
		return fmt.Errorf("stop: %w", stopErr)
	}
	logger.Info("scheduler: stopped")
	return nil
}

// What /healthz of --metrics-addr answers: 200 "ok" while the client runs, 503 with the phase before and after.
const (
	healthRunning  = "ok"
	healthStarting = "starting"
	healthStopping = "stopping"
)

// healthServer serves /metrics and /healthz. /healthz answers 200 while the client runs, 503 with the phase
// (waiting for the database, starting, stopping) before and after. Its methods are safe on a nil *healthServer
// (no --metrics-addr).
type healthServer struct {
	ln     net.Listener
	srv    *http.Server
	status atomic.Pointer[string]
	served chan struct{}
	logger *slog.Logger
}

// schemaWatchInterval is how often a running daemon checks that the database's schema is still its own (a
// `migrate up` of another version while it runs): /healthz answers 503 while it is not.
const schemaWatchInterval = 30 * time.Second

// watchSchema checks the schema every interval until ctx ends: a mismatch turns /healthz to 503 with what to do
// (and logs it once); a match turns it back to 200. Read failures are left to the pools. The returned function
// waits for the watch to end (after ctx ended).
func watchSchema(ctx context.Context, pool migrations.Querier, health *healthServer, logger *slog.Logger,
	interval time.Duration) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		reported := ""
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := migrations.Check(ctx, pool)
			switch {
			case isSchemaMismatch(err):
				health.setStatus(err.Error())
				if reported != err.Error() {
					logger.Error("scheduler: the database's schema changed under this daemon", slog.Any("error", err))
					reported = err.Error()
				}
			case err == nil && reported != "":
				health.setStatus(healthRunning)
				reported = ""
			}
		}
	}()
	return func() { <-done }
}

// addr is the address the server listens on.
func (h *healthServer) addr() string { return h.ln.Addr().String() }

// healthShutdownTimeout bounds the wait for in-flight scrapes when the server closes.
const healthShutdownTimeout = 5 * time.Second

// startHealthServer listens on addr and serves in the background.
func startHealthServer(addr string, registry *prometheus.Registry, logger *slog.Logger) (*healthServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	h := &healthServer{served: make(chan struct{}), logger: logger, ln: ln}
	h.setStatus(waitingForDatabase)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if status := *h.status.Load(); status != healthRunning {
			http.Error(w, status, http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, healthRunning)
	})
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(h.served)
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("scheduler: metrics server stopped", slog.Any("error", err))
		}
	}()
	logger.Info("scheduler: serving /metrics and /healthz", slog.String("addr", ln.Addr().String()))
	return h, nil
}

// setStatus sets what /healthz answers: healthRunning (200) or a phase (503).
func (h *healthServer) setStatus(status string) {
	if h != nil {
		h.status.Store(&status)
	}
}

// close shuts the server down and waits for it; it is idempotent.
func (h *healthServer) close() {
	if h == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), healthShutdownTimeout)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
	<-h.served
}
