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
)

// runParams are the resolved flags of `scheduler run`.
type runParams struct {
	databaseURL string
	metricsAddr string
	uiAddr      string
	uiActions   uiActionFlags
	allowExec   bool
	daemon      daemonFlags
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
	return cmd
}

// runDaemon runs the client until ctx ends (SIGINT/SIGTERM), then stops it gracefully. Teardown is ordered:
// stop claiming, drain and release attempts (Client.Stop), close the pool, and the health server last.
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

	pool, err := openPool(ctx, p.databaseURL, p.daemon.concurrency, p.daemon.pollOnly)
	if err != nil {
		return err
	}
	defer pool.Close()
	stopUI := func() error { return nil }
	if p.uiAddr != "" {
		var where string
		copts, err := p.uiActions.options(logger)
		if err != nil {
			return err
		}
		if stopUI, where, err = serveConsole(ctx, pool, p.uiAddr, copts); err != nil {
			return err
		}
		logger.Info("scheduler: console listening", slog.String("url", where))
	}

	client, err := startClient(ctx, pool, &p.daemon, p.allowExec, logger, registry)
	if err != nil {
		_ = stopUI()
		return err
	}
	disarm := o.watchSignals()
	defer disarm()
	health.setRunning(true)
	logger.Info("scheduler: running; SIGINT or SIGTERM stops it", slog.String("dispatch", client.Config().Dispatch),
		slog.String("worker", client.Config().WorkerID))

	<-ctx.Done()
	health.setRunning(false)
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

// healthServer serves /metrics and /healthz. /healthz answers 200 while the client runs, 503 before and after.
// Its methods are safe on a nil *healthServer (no --metrics-addr).
type healthServer struct {
	srv     *http.Server
	running atomic.Bool
	served  chan struct{}
	logger  *slog.Logger
}

// healthShutdownTimeout bounds the wait for in-flight scrapes when the server closes.
const healthShutdownTimeout = 5 * time.Second

// startHealthServer listens on addr and serves in the background.
func startHealthServer(addr string, registry *prometheus.Registry, logger *slog.Logger) (*healthServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	h := &healthServer{served: make(chan struct{}), logger: logger}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !h.running.Load() {
			http.Error(w, "not running", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
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

func (h *healthServer) setRunning(running bool) {
	if h != nil {
		h.running.Store(running)
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
