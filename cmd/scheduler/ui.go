package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/stepready/stepready/console"
)

// uiActionFlags are the console's action flags, on `scheduler ui` and `scheduler run`.
type uiActionFlags struct {
	allow bool
	token string
}

func (f *uiActionFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&f.allow, "ui-allow-actions", false,
		"let signed-in browsers act in the console: task cancel, pause, resume, reset; step retry, resolve")
	fs.StringVar(&f.token, "ui-token", "", "the token that signs a browser in to the console (needed by --ui-allow-actions)")
	setDefaultText(fs, "ui-token", "none")
}

// options returns the console's options, refusing actions without a token.
func (f *uiActionFlags) options(logger *slog.Logger) (console.Options, error) {
	if f.allow && f.token == "" {
		return console.Options{}, usagef("--ui-allow-actions needs a token: --ui-token or STEPREADY_UI_TOKEN")
	}
	return console.Options{Logger: logger, AllowActions: f.allow, Token: f.token}, nil
}

// newUICommand builds `scheduler ui`: the web console (SPEC §16) on its own, read-only unless actions are
// allowed.
func newUICommand(opts *globalOptions) *cobra.Command {
	var dbURL, addr string
	var actions uiActionFlags
	var wait waitBound
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web console on --addr (read-only unless --ui-allow-actions)",
		Long: "Serve the web console: tasks, a task's DAG, steps, attempts and events, templates, retry policies,\n" +
			"schedules and flow limits, with live updates of an open task page. It binds to loopback by default.\n" +
			"The same console is served by `scheduler run --ui-addr` and by `scheduler demo` (read-only).\n\n" +
			"With --ui-allow-actions and a token (--ui-token or STEPREADY_UI_TOKEN), a browser that signs in with\n" +
			"the token may cancel, pause, resume and reset tasks and retry and resolve steps; the database role\n" +
			"then needs stepready_operator's rights. Every action is an operator event with details.actor = \"ui\".\n\n" +
			"It listens at once and waits for the database (--wait-for-db, default forever), trying again with\n" +
			"backoff and logging each failure; meanwhile every page, /healthz included, answers 503.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := databaseURL(dbURL)
			if err != nil {
				return err
			}
			logger, err := opts.logger()
			if err != nil {
				return err
			}
			copts, err := actions.options(logger)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := newPool(ctx, url, daemonPoolSize(4), true) // as before: 4 plus the headroom
			if err != nil {
				return err
			}
			defer pool.Close()
			srv, err := listenConsole(ctx, addr, logger)
			if err != nil {
				return err
			}
			fmt.Fprintf(opts.stdout, "console: %s\n", srv.url)
			if err := waitForDatabase(ctx, pool, wait, logger); err != nil {
				_ = srv.stop()
				if errors.Is(err, errStoppedWaiting) {
					logger.Info("console: " + err.Error())
					return nil
				}
				return err
			}
			if err := checkSchema(ctx, pool); err != nil {
				_ = srv.stop()
				return err
			}
			if err := srv.attach(pool, copts); err != nil {
				_ = srv.stop()
				return err
			}
			<-ctx.Done()
			return srv.stop()
		},
	}
	cmd.Flags().StringVar(&dbURL, "database-url", "", "PostgreSQL URL of the stepready database")
	setDefaultText(cmd.Flags(), "database-url", "none")
	cmd.Flags().StringVar(&addr, "addr", console.DefaultAddr, "address the console listens on (host:port)")
	actions.register(cmd.Flags())
	registerWaitFlag(cmd.Flags(), &wait)
	return cmd
}

// consoleServer is the console's HTTP server. It listens before the database is reachable: until attach, every
// path (/healthz included) answers 503 "starting: waiting for the database", so that a supervisor or a load
// balancer sees a console that starts.
type consoleServer struct {
	srv     *http.Server
	url     string
	served  chan struct{}
	console atomic.Pointer[console.Console]
}

// listenConsole listens on addr and serves the "starting" answer until attach.
func listenConsole(ctx context.Context, addr string, logger *slog.Logger) (*consoleServer, error) {
	logger = cmp.Or(logger, slog.Default())
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("console: listen on %s: %w", addr, err)
	}
	s := &consoleServer{url: "http://" + ln.Addr().String() + "/", served: make(chan struct{})}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("console: serve", "err", err)
		}
	}()
	return s, nil
}

func (s *consoleServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if c := s.console.Load(); c != nil {
		c.ServeHTTP(w, r)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Retry-After", "1")
	http.Error(w, waitingForDatabase, http.StatusServiceUnavailable)
}

// attach serves the console over pool from now on.
func (s *consoleServer) attach(pool *pgxpool.Pool, opts console.Options) error {
	c, err := console.New(pool, opts)
	if err != nil {
		return err
	}
	s.console.Store(c)
	return nil
}

// stop closes the console (its live streams, so that Shutdown does not wait for them) and shuts the server down.
// Call it before the pool closes.
func (s *consoleServer) stop() error {
	if c := s.console.Load(); c != nil {
		c.Close()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(shutdownCtx)
	<-s.served
	return err
}

// serveConsole listens on addr and serves the console over pool until stop is called. It returns the console's
// URL.
func serveConsole(ctx context.Context, pool *pgxpool.Pool, addr string, opts console.Options) (
	stop func() error, url string, err error) {
	s, err := listenConsole(ctx, addr, opts.Logger)
	if err != nil {
		return nil, "", err
	}
	if err := s.attach(pool, opts); err != nil {
		_ = s.stop()
		return nil, "", err
	}
	return s.stop, s.url, nil
}

// demoConsole serves the console for `scheduler demo` and prints its URL; a console that cannot listen (the
// port is taken) is reported and the demo goes on without it. It returns the stop function, or nil.
func (o *globalOptions) demoConsole(ctx context.Context, pool *pgxpool.Pool, addr string, logger *slog.Logger) func() {
	if addr == "" {
		return nil
	}
	// The demo's console is read-only: it runs on a throwaway database with no token to give anyone.
	stop, url, err := serveConsole(ctx, pool, addr, console.Options{Logger: logger})
	if err != nil {
		fmt.Fprintf(o.stdout, "console: not started (%v); pass --ui-addr to choose another address\n\n", err)
		return nil
	}
	fmt.Fprintf(o.stdout, "console: %s (the demo tasks are visible there)\n\n", url)
	return func() {
		if err := stop(); err != nil {
			logger.Warn("console: stop", "err", err)
		}
	}
}
