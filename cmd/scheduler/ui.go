package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web console on --addr (read-only unless --ui-allow-actions)",
		Long: "Serve the web console: tasks, a task's DAG, steps, attempts and events, templates, retry policies,\n" +
			"schedules and flow limits, with live updates of an open task page. It binds to loopback by default.\n" +
			"The same console is served by `scheduler run --ui-addr` and by `scheduler demo` (read-only).\n\n" +
			"With --ui-allow-actions and a token (--ui-token or STEPREADY_UI_TOKEN), a browser that signs in with\n" +
			"the token may cancel, pause, resume and reset tasks and retry and resolve steps; the database role\n" +
			"then needs stepready_operator's rights. Every action is an operator event with details.actor = \"ui\".",
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
			pool, err := openPool(cmd.Context(), url, 4, true)
			if err != nil {
				return err
			}
			defer pool.Close()
			stop, where, err := serveConsole(cmd.Context(), pool, addr, copts)
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
	actions.register(cmd.Flags())
	return cmd
}

// serveConsole listens on addr and serves the console over pool until stop is called (or ctx ends). It returns
// the console's URL.
func serveConsole(ctx context.Context, pool *pgxpool.Pool, addr string, opts console.Options) (
	stop func() error, url string, err error) {
	logger := cmp.Or(opts.Logger, slog.Default())
	c, err := console.New(pool, opts)
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
