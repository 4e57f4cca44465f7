package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/console"
	"github.com/stepready/stepready/examples"
	"github.com/stepready/stepready/internal/demo"
	"github.com/stepready/stepready/internal/pgcluster"
	"github.com/stepready/stepready/internal/templates"
	"github.com/stepready/stepready/migrations"
)

// demoDataDirDefault is where the demo keeps its local PostgreSQL cluster: git-ignored, in the directory the
// demo runs from (the clone's root under `make run`).
const demoDataDirDefault = ".stepready"

// demoParams are the resolved flags of `scheduler demo`.
type demoParams struct {
	databaseURL  string
	dataDir      string
	examplesDir  string
	exitWhenDone bool
	uiAddr       string
	daemon       daemonFlags
}

// newDemoCommand builds `scheduler demo`, what `make run` starts.
func newDemoCommand(opts *globalOptions) *cobra.Command {
	p := &demoParams{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the example tasks on a local database and print a live account of what happens",
		Long: "Run the example tasks and print a live account of every attempt, failure, retry and completion.\n\n" +
			"Without --database-url (or DATABASE_URL) it starts a local PostgreSQL cluster kept in --data-dir\n" +
			"(initialised on first use, reused afterwards, stopped on exit), migrates it, loads the example\n" +
			"templates (examples/*.yaml, built into the binary), creates one task from each, runs the daemon in\n" +
			"this process, and prints the account until every demo task is finished, then a summary. The daemon\n" +
			"keeps running until Ctrl-C (or exits after the summary with --exit-when-done). Logs go to stderr at\n" +
			"level warn unless --log-level says otherwise.\n\n" +
			"Every flag also reads the environment variable shown with it; a flag on the command line wins.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.daemon.validate(); err != nil {
				return err
			}
			if !cmd.Flags().Changed("log-level") {
				opts.logLevel = "warn" // the account is the output; logs only for trouble
			}
			logger, err := opts.logger()
			if err != nil {
				return err
			}
			return opts.runDemo(cmd.Context(), p, logger)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&p.databaseURL, "database-url", "",
		"PostgreSQL URL of the database to use (the demo migrates it)")
	setDefaultText(fs, "database-url", "none: the local cluster in --data-dir")
	fs.StringVar(&p.dataDir, "data-dir", demoDataDirDefault,
		"directory of the local PostgreSQL cluster used without --database-url")
	fs.StringVar(&p.examplesDir, "examples", "",
		"directory of YAML task templates to run instead of the built-in examples")
	setDefaultText(fs, "examples", "the built-in examples/*.yaml")
	fs.BoolVar(&p.exitWhenDone, "exit-when-done", false,
		"exit after the summary instead of running until Ctrl-C")
	fs.StringVar(&p.uiAddr, "ui-addr", console.DefaultAddr, "address of the web console (empty: none)")
	// Direct dispatch: the demo is one process, and its own worker pool shows the policy's delays without
	// River's fetch cycle in between.
	p.daemon.register(fs, stepready.DispatchDirect)
	return cmd
}

// runDemo runs the demo until its tasks are done (with --exit-when-done) or ctx ends.
func (o *globalOptions) runDemo(ctx context.Context, p *demoParams, logger *slog.Logger) (err error) {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		// Ctrl-C while starting (initdb, migrations) fails whatever ran; the details are noise then.
		if err != nil && ctx.Err() != nil {
			logger.Debug("scheduler: demo interrupted", slog.Any("error", err))
			err = errors.New("demo: interrupted")
		}
	}()
	// The live account prints task and step names, errors and outputs: no terminal control sequence gets through.
	var out io.Writer = termWriter{w: o.stdout}

	var templateFS fs.FS = examples.FS
	if p.examplesDir != "" {
		templateFS = os.DirFS(p.examplesDir)
	}
	ts, err := templates.Load(templateFS)
	if err != nil {
		return err
	}

	dbURL := strings.TrimSpace(p.databaseURL)
	if dbURL == "" {
		fmt.Fprintf(out, "PostgreSQL: starting the local cluster in %s (the first run initialises it)\n", p.dataDir)
		cluster, err := pgcluster.StartPersistent(ctx, p.dataDir, logger)
		if err != nil {
			return err
		}
		defer func() {
			if stopErr := cluster.Stop(context.WithoutCancel(ctx)); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
		}()
		how := "started"
		if !cluster.Started {
			how = "already running, reused"
		}
		dbURL = cluster.URL
		fmt.Fprintf(out, "PostgreSQL: %s (%s; data in %s)\n", dbURL, how, cluster.DataDir)
	}

	if err := migrations.Up(ctx, dbURL, logger); err != nil {
		return err
	}
	pool, err := openPool(ctx, dbURL, p.daemon.concurrency, p.daemon.pollOnly)
	if err != nil {
		return err
	}
	defer pool.Close()

	if err := templates.Store(ctx, pool, ts); err != nil {
		return err
	}
	account, err := demo.NewAccount(ctx, pool, out, demo.Options{})
	if err != nil {
		return err
	}
	tasks := make([]demo.Task, 0, len(ts))
	labels := make([]string, 0, len(ts))
	for _, t := range ts {
		id, err := templates.CreateTask(ctx, pool, t.Name)
		if err != nil {
			return err
		}
		task := demo.Task{ID: id, Name: t.Name}
		tasks = append(tasks, task)
		labels = append(labels, task.Label()+" ("+t.File+")")
	}
	fmt.Fprintf(out, "tasks: %s\n\n", strings.Join(labels, ", "))
	// Deferred after the pool's Close, so it runs before it: the console's live poller reads through the pool.
	if stopUI := o.demoConsole(ctx, pool, p.uiAddr, logger); stopUI != nil {
		defer stopUI()
	}

	client, err := startClient(ctx, pool, &p.daemon, false, logger, nil)
	if err != nil {
		return err
	}
	disarm := o.watchSignals()
	defer disarm()
	// The demo's wait steps get their signal a few seconds after they start waiting.
	signalCtx, stopSignals := context.WithCancel(ctx)
	signalsDone := make(chan struct{})
	go func() {
		defer close(signalsDone)
		demoSignals(signalCtx, pool, tasks, logger)
	}()
	defer func() { stopSignals(); <-signalsDone }()

	watchErr := account.Watch(ctx, tasks)
	if watchErr == nil && !p.exitWhenDone {
		fmt.Fprintf(out, "\nThe demo tasks are done. The daemon keeps running; create more tasks with\n"+
			"  psql '%s' -c \"SELECT stepready.create_task_from_template('flaky', '{}')\"\n"+
			"or a schedule that creates one every ten seconds (this daemon fires it):\n"+
			"  scheduler schedule create demo --template flaky --cron '@every 10s' --database-url '%s'\n"+
			"and watch them here. Ctrl-C stops it.\n\n", redact(dbURL), redact(dbURL))
		watchErr = account.Follow(ctx)
	}
	if ctx.Err() != nil {
		watchErr = nil // Ctrl-C: a normal end
		fmt.Fprintln(out, "\nstopping…")
	}
	stopErr := client.Stop(context.WithoutCancel(ctx))
	return errors.Join(watchErr, stopErr)
}

// redact hides the password of a database URL.
func redact(databaseURL string) string {
	if u, err := url.Parse(databaseURL); err == nil && u.User != nil {
		return u.Redacted()
	}
	return databaseURL
}
