package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/stepready/stepready/console"
)

// newUICommand builds `scheduler ui`: the web console (SPEC §16) on its own, read-only.
func newUICommand(opts *globalOptions) *cobra.Command {
	var dbURL, addr string
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web console (read-only) on --addr",
		Long: "Serve the web console: tasks, a task's DAG, steps, attempts and events, templates, retry policies,\n" +
			"schedules and flow limits, with live updates of an open task page. It binds to loopback by default.\n" +
			"The same console is served by `scheduler run --ui-addr` and by `scheduler demo`.",
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
			pool, err := openPool(cmd.Context(), url, 4)
			if err != nil {
				return err
			}
			defer pool.Close()
			stop, where, err := serveConsole(cmd.Context(), pool, addr, logger)
			if err != nil {
				return err
			}
			fmt.Fprintf(opts.stdout, "console: %s\n", where)
			<-cmd.Context().Done()
			return stop()
		},
	}
	cmd.Flags().StringVar(&dbURL, "database-url", "", "PostgreSQL URL of the stepready database")
	setDefaultText(cmd.Flags(), "database-url", "none")
	cmd.Flags().StringVar(&addr, "addr", console.DefaultAddr, "address the console listens on (host:port)")
	return cmd
}

// serveConsole listens on addr and serves the console over pool until stop is called (or ctx ends). It returns
// the console's URL.
func serveConsole(ctx context.Context, pool *pgxpool.Pool, addr string, logger *slog.Logger) (
	stop func() error, url string, err error) {
	c, err := console.New(pool, console.Options{Logger: logger})
	if err != nil {
		return nil, "", err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		c.Close()
		return nil, "", fmt.Errorf("console: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("console: serve", "err", err)
		}
	}()
	return func() error {
		c.Close() // ends the live streams, so Shutdown does not wait for them
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	}, "http://" + ln.Addr().String() + "/", nil
}

// demoConsole serves the console for `scheduler demo` and prints its URL; a console that cannot listen (the
// port is taken) is reported and the demo goes on without it. It returns the stop function, or nil.
func (o *globalOptions) demoConsole(ctx context.Context, pool *pgxpool.Pool, addr string, logger *slog.Logger) func() {
	if addr == "" {
		return nil
	}
	stop, url, err := serveConsole(ctx, pool, addr, logger)
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
