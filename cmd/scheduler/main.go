// Command scheduler is stepready's command line: it migrates the database (scheduler migrate up|down|status|force)
// and runs the daemon (scheduler run).
//
// It is a thin layer: flags and environment variables are read here and nowhere else, and every command calls
// into a package that does the work. The database comes from --database-url, else from $DATABASE_URL. Logs are
// slog text on stderr; results meant for people or scripts go to stdout.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "scheduler: %v\n", err)
		os.Exit(1)
	}
}

// globalOptions are the flags every command shares.
type globalOptions struct {
	logLevel string
	stdout   io.Writer
	stderr   io.Writer
}

// logger builds the slog text logger on stderr at the level of --log-level.
func (o *globalOptions) logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	return slog.New(slog.NewTextHandler(o.stderr, &slog.HandlerOptions{Level: level})), nil
}

// newRootCommand assembles the command tree; stdout and stderr are parameters so that tests can capture them.
func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	opts := &globalOptions{stdout: stdout, stderr: stderr}

	root := &cobra.Command{
		Use:           "scheduler",
		Short:         "stepready: a PostgreSQL-driven step readiness scheduler",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&opts.logLevel, "log-level", "info", "log level: debug, info, warn or error")

	root.AddCommand(newMigrateCommand(opts), newRunCommand(opts))
	return root
}

// databaseURL returns the --database-url flag, else $DATABASE_URL, else a clear error. The environment value is
// not used as the flag's default so that --help never prints a password.
func databaseURL(flagValue string) (string, error) {
	if url := strings.TrimSpace(flagValue); url != "" {
		return url, nil
	}
	if url := strings.TrimSpace(os.Getenv("DATABASE_URL")); url != "" {
		return url, nil
	}
	return "", errors.New("no database: pass --database-url or set DATABASE_URL " +
		"(for example postgres://user:password@localhost:5432/stepready)")
}
