// Command scheduler is stepready's command line: it migrates the database (scheduler migrate up|down|status|force),
// runs the daemon (scheduler run) and runs a demonstration on a local database (scheduler demo, what `make run`
// starts).
//
// It is a thin layer: flags and environment variables are read here and nowhere else, and every command calls
// into a package that does the work. Every flag also reads an environment variable, STEPREADY_<FLAG> (upper
// case, dashes as underscores), and --database-url also reads DATABASE_URL; a flag given on the command line
// wins (env.go). Logs are slog text or JSON on stderr; results meant for people or scripts go to stdout. A usage
// error (a bad flag, argument or environment value) exits with status 2, any other failure with status 1.
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
		// An error may quote client-supplied text (a task name in the database's message).
		fmt.Fprintf(os.Stderr, "scheduler: %s\n", escapeTerm(err.Error(), "\n\t"))
		os.Exit(exitCode(err))
	}
}

// Log formats of --log-format.
const (
	logFormatText = "text"
	logFormatJSON = "json"
)

// globalOptions are the flags every command shares, and the process's outside world, which tests replace.
type globalOptions struct {
	logLevel  string
	logFormat string

	stdout io.Writer
	stderr io.Writer

	// lookupEnv reads an environment variable (os.LookupEnv).
	lookupEnv func(string) (string, bool)

	// exit ends the process at once (os.Exit); used at a second SIGINT/SIGTERM.
	exit func(code int)

	// daemon runs `scheduler run` once its flags are resolved (nil: runDaemon). Tests set it to inspect the
	// resolved flags without a database.
	daemon func(context.Context, *runParams) error
}

// logger builds the slog logger on stderr with --log-level and --log-format.
func (o *globalOptions) logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch o.logFormat {
	case logFormatText:
		return slog.New(slog.NewTextHandler(o.stderr, opts)), nil
	case logFormatJSON:
		return slog.New(slog.NewJSONHandler(o.stderr, opts)), nil
	}
	return nil, usagef("--log-format %q: want %s or %s", o.logFormat, logFormatText, logFormatJSON)
}

// newRootCommand assembles the command tree; stdout and stderr are parameters so that tests can capture them.
func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	return newRootCommandWith(&globalOptions{stdout: stdout, stderr: stderr, lookupEnv: os.LookupEnv, exit: os.Exit})
}

// newRootCommandWith assembles the command tree around opts.
func newRootCommandWith(opts *globalOptions) *cobra.Command {
	root := &cobra.Command{
		Use:           "scheduler",
		Short:         "stepready: a PostgreSQL-driven step readiness scheduler",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Runs before every command: the environment fills the flags the command line did not set.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd, opts.lookupEnv); err != nil {
				return usageError{err}
			}
			if !printsJSON(cmd) {
				// Table and text output never carries a terminal control sequence (term.go).
				cmd.SetOut(termWriter{w: opts.stdout})
			}
			return nil
		},
	}
	root.SetOut(opts.stdout)
	root.SetErr(opts.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.SetUsageTemplate(usageTemplate(root))
	root.PersistentFlags().StringVar(&opts.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().StringVar(&opts.logFormat, "log-format", logFormatText,
		"log format on stderr: text or json (slog)")

	root.AddCommand(newMigrateCommand(opts), newRunCommand(opts), newDemoCommand(opts))
	root.AddCommand(newExplainCommand(opts), newTaskCommand(opts), newStepCommand(opts), newTemplateCommand(opts),
		newPolicyCommand(opts))
	root.AddCommand(newScheduleCommand(opts), newPruneCommand(opts), newUICommand(opts), newFlowCommand(opts),
		newSignalCommand(opts))
	return root
}

// errNoDatabase says how to name the database.
var errNoDatabase = usageError{errors.New("no database: pass --database-url or set DATABASE_URL " +
	"(for example postgres://user:password@localhost:5432/stepready)")}

// databaseURL returns the --database-url flag (which the environment fills, see env.go), or a clear error. The
// environment value is not used as the flag's default so that --help never prints a password.
func databaseURL(flagValue string) (string, error) {
	if url := strings.TrimSpace(flagValue); url != "" {
		return url, nil
	}
	return "", errNoDatabase
}
