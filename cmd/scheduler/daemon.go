package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// daemonFlags are the flags of the client configuration, shared by `run` and `demo`. Their defaults are the
// root package's.
type daemonFlags struct {
	dispatch      string
	concurrency   int
	queues        []string
	lease         time.Duration
	reapInterval  time.Duration
	pollInterval  time.Duration
	probeInterval time.Duration
	shutdownGrace time.Duration
	workerID      string
	pollOnly      bool
	// Retention (SPEC §13): 0 (or off) on the command line keeps those tasks forever (stepready.KeepForever).
	retentionComplete time.Duration
	retentionFailed   time.Duration
	// The maintenance services' intervals: off (or -1) turns one off (stepready.Off).
	pruneInterval    time.Duration
	scheduleInterval time.Duration
	backlogInterval  time.Duration
	// The http handler's guard (SPEC §17).
	httpDenyPrivate bool
	httpAllowHosts  []string
	maxOutputBytes  int
	// sqlDatabaseURL is the database of the `sql` handler's own pool (SPEC §17); empty: `sql` is disabled.
	sqlDatabaseURL string
}

// register defines the flags on fs; dispatchDefault is the default of --dispatch.
func (d *daemonFlags) register(fs *pflag.FlagSet, dispatchDefault string) {
	fs.StringVar(&d.dispatch, "dispatch", dispatchDefault, "how claimed steps reach a worker: "+
		stepready.DispatchRiver+" (River jobs, worked by any scheduler on the database) or "+
		stepready.DispatchDirect+" (this process's own worker pool)")
	fs.StringSliceVar(&d.queues, "queues", stepready.QueuesDefault(),
		"the queues whose steps this process claims, comma-separated (in River dispatch its River client works exactly\n"+
			"these); it claims only steps whose handler it has, so a step no running scheduler can take stays ready")
	fs.IntVar(&d.concurrency, "concurrency", stepready.ConcurrencyDefault,
		"attempts this process runs at once; claims never exceed the free capacity")
	fs.DurationVar(&d.lease, "lease", stepready.LeaseDefault, fmt.Sprintf("attempt lease, renewed every "+
		"lease/3; an attempt whose worker died is retried within lease + reap interval (at least %s)", stepready.LeaseMin))
	d.reapInterval = stepready.ReapIntervalDefault
	fs.Var(offDuration{&d.reapInterval, false}, "reap-interval",
		"how often the elected instance reaps expired leases; shorter than --lease; off: never on this instance")
	fs.DurationVar(&d.pollInterval, "poll-interval", stepready.PollIntervalDefault,
		"fallback poll for ready steps when no notification or retry timer wakes the claimer")
	d.probeInterval = stepready.ProbeIntervalDefault
	fs.Var(offDuration{&d.probeInterval, false}, "probe-interval",
		"how often the idle claimer reads the wake-up counter, so that work readied without a notification (plain\n"+
			"SQL, other processes' completions) starts within about this long; off: never")
	fs.DurationVar(&d.shutdownGrace, "shutdown-grace", stepready.ShutdownGraceDefault,
		"at SIGINT/SIGTERM, how long running attempts may finish before they are cancelled and handed back uncharged")
	fs.StringVar(&d.workerID, "worker-id", "", "this process's name in leases and events")
	setDefaultText(fs, "worker-id", "hostname-pid")
	fs.BoolVar(&d.pollOnly, "poll-only", false,
		"never LISTEN, only poll (for PgBouncer in transaction pooling mode)")
	d.retentionComplete, d.retentionFailed = stepready.RetentionCompleteDefault, stepready.RetentionFailedDefault
	fs.Var(offDuration{&d.retentionComplete, true}, "retention-complete",
		"how long complete tasks are kept after they finished, with their steps and events; 0 or off keeps them forever")
	fs.Var(offDuration{&d.retentionFailed, true}, "retention-failed",
		"how long error and cancelled tasks are kept after they finished; 0 or off keeps them forever")
	d.pruneInterval = stepready.PruneIntervalDefault
	fs.Var(offDuration{&d.pruneInterval, false}, "prune-interval",
		"how often the elected instance deletes the finished tasks past their retention and idle flow keys' state; off: never on this instance")
	d.scheduleInterval = stepready.ScheduleIntervalDefault
	fs.Var(offDuration{&d.scheduleInterval, false}, "schedule-interval",
		"the longest the elected instance waits between two looks at the schedules (fires are on time whatever it is); off: this instance fires no schedules")
	d.backlogInterval = stepready.BacklogIntervalDefault
	fs.Var(offDuration{&d.backlogInterval, false}, "backlog-interval",
		"how often the elected instance sets the backlog gauges of /metrics; off: this instance exports none")
	fs.IntVar(&d.maxOutputBytes, "max-output-bytes", steps.MaxOutputBytesDefault,
		"the largest output (as JSON) an attempt may record; a larger one fails it as contract_failure")
	fs.StringVar(&d.sqlDatabaseURL, "sql-database-url", "",
		"database URL the sql handler runs step SQL on, with a pool of its own (pool_max_conns in the URL; default pgx's:\n"+
			"the larger of 4 and the number of CPUs);\n"+
			"without it sql steps fail permanent: step SQL never runs on the scheduler's connection")
	fs.BoolVar(&d.httpDenyPrivate, "http-deny-private", false,
		"the http handler also refuses loopback and private addresses (link-local, cloud metadata, always)")
	fs.StringSliceVar(&d.httpAllowHosts, "http-allow-hosts", nil,
		"exceptions to the http handler's guard: host names, IP addresses or CIDR prefixes, comma-separated")
}

// offDuration is a duration flag that also takes "off" or -1, meaning stepready.Off (the service is turned off,
// the tasks kept forever); with zeroIsOff, 0 means the same (the retention flags: SPEC §13). The environment
// variables take the same values.
type offDuration struct {
	d         *time.Duration
	zeroIsOff bool
}

func (v offDuration) String() string {
	if v.d == nil {
		return ""
	}
	if *v.d == stepready.Off {
		return "off"
	}
	return v.d.String()
}

func (v offDuration) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "off", "-1":
		*v.d = stepready.Off
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration (90s, 5m, 24h) or off: %w", err)
	}
	if d == 0 && v.zeroIsOff {
		d = stepready.Off
	}
	*v.d = d
	return nil
}

func (v offDuration) Type() string { return "duration" }

// noGrace maps --shutdown-grace 0 (no grace: cancel at once) to stepready.Off, since a zero Config field takes
// the default.
func noGrace(d time.Duration) time.Duration {
	if d == 0 {
		return stepready.Off
	}
	return d
}

// configFlags names the flag of each Config field the daemon flags set, for Config.Validate's errors.
var configFlags = map[string]string{
	"Dispatch": "dispatch", "Concurrency": "concurrency", "Queues": "queues", "Lease": "lease", "ReapInterval": "reap-interval",
	"PollInterval": "poll-interval", "ProbeInterval": "probe-interval", "ShutdownGrace": "shutdown-grace", "WorkerID": "worker-id",
	"RetentionComplete": "retention-complete", "RetentionFailed": "retention-failed",
	"PruneInterval": "prune-interval", "ScheduleInterval": "schedule-interval", "BacklogInterval": "backlog-interval",
}

// validate checks the flags with Config.Validate (the one set of rules), naming the flag at fault; its errors are
// usage errors. Only what the command line adds to Config is checked here.
func (d *daemonFlags) validate() error {
	if d.maxOutputBytes < 1 {
		return usagef("--max-output-bytes %d: must be 1 or more", d.maxOutputBytes)
	}
	// A zero in Config takes the default; a 0 typed on the command line is a mistake.
	if d.concurrency == 0 {
		return usagef("--concurrency 0: must be 1 or more")
	}
	if len(d.queues) == 0 {
		return usagef("--queues: name at least one queue (default: default)")
	}
	for _, f := range []struct {
		flag string
		v    time.Duration
	}{{"lease", d.lease}, {"reap-interval", d.reapInterval}, {"poll-interval", d.pollInterval},
		{"prune-interval", d.pruneInterval}, {"schedule-interval", d.scheduleInterval},
		{"backlog-interval", d.backlogInterval}, {"probe-interval", d.probeInterval}} {
		if f.v == 0 {
			return usagef("--%s 0s: must be more than 0", f.flag)
		}
	}
	err := d.config(steps.NewRegistry(), nil, nil).Validate()
	if err == nil {
		return nil
	}
	var msgs []string
	for _, e := range unjoin(err) {
		var ce *stepready.ConfigError
		if errors.As(e, &ce) && configFlags[ce.Field] != "" {
			value := fmt.Sprint(ce.Value)
			if dur, ok := ce.Value.(time.Duration); ok && dur == stepready.Off {
				value = "off"
			}
			problem := strings.NewReplacer(", or Off", ", or off", ", or KeepForever", ", or 0 (keep forever)",
				"the lease", "--lease").Replace(ce.Problem)
			msgs = append(msgs, fmt.Sprintf("--%s %s: %s", configFlags[ce.Field], value, problem))
			continue
		}
		msgs = append(msgs, e.Error())
	}
	return usagef("%s", strings.Join(msgs, "; "))
}

// unjoin returns the errors joined in err (its wrapped errors.Join), or err alone.
func unjoin(err error) []error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			return j.Unwrap()
		}
	}
	return []error{err}
}

// config is the client configuration of the flags.
func (d *daemonFlags) config(reg *steps.Registry, logger *slog.Logger, metrics prometheus.Registerer) stepready.Config {
	return stepready.Config{
		Registry:          reg,
		Dispatch:          d.dispatch,
		Concurrency:       d.concurrency,
		Queues:            d.queues,
		Lease:             d.lease,
		ReapInterval:      d.reapInterval,
		PollInterval:      d.pollInterval,
		ProbeInterval:     d.probeInterval,
		ShutdownGrace:     noGrace(d.shutdownGrace),
		WorkerID:          d.workerID,
		PollOnly:          d.pollOnly,
		RetentionComplete: d.retentionComplete,
		RetentionFailed:   d.retentionFailed,
		PruneInterval:     d.pruneInterval,
		ScheduleInterval:  d.scheduleInterval,
		BacklogInterval:   d.backlogInterval,
		MaxOutputBytes:    d.maxOutputBytes,
		Logger:            logger,
		Metrics:           metrics,
	}
}

// poolHeadroom is how many connections the pool has beyond one per concurrent attempt: the claimer, the reaper
// and River's own work.
const poolHeadroom = 5

// daemonPoolSize is the pool size of a daemon running concurrency attempts at once: one connection per attempt,
// so that workers do not queue for connections, plus headroom.
func daemonPoolSize(concurrency int) int32 {
	return int32(min(concurrency, 10_000)) + poolHeadroom
}

// openPool opens and checks the pool of a daemon (see daemonPoolSize and newPool), failing at once when the
// database does not answer. `scheduler demo` uses it; `scheduler run` waits for the database instead
// (waitForDatabase).
func openPool(ctx context.Context, url string, concurrency int, pooler bool) (*pgxpool.Pool, error) {
	pool, err := newPool(ctx, url, daemonPoolSize(concurrency), pooler)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	return pool, nil
}

// startClient builds the registry of built-in handlers and starts a client with the flags' configuration.
func startClient(ctx context.Context, pool *pgxpool.Pool, d *daemonFlags, allowExec bool, logger *slog.Logger,
	metrics prometheus.Registerer) (*stepready.Client, error) {
	reg := steps.NewRegistry()
	guard := builtin.HTTPGuard{DenyPrivate: d.httpDenyPrivate, AllowHosts: d.httpAllowHosts}
	if err := guard.Validate(); err != nil {
		return nil, usagef("--http-allow-hosts: %w", err)
	}
	var sqlPool *pgxpool.Pool
	if d.sqlDatabaseURL != "" {
		cfg, err := pgxpool.ParseConfig(d.sqlDatabaseURL)
		if err != nil {
			return nil, usagef("--sql-database-url: %w", err)
		}
		if d.pollOnly {
			// Step SQL may go through the same pooler as the daemon: one statement per step, no named one.
			store.UsePoolerQueryMode(cfg.ConnConfig)
		}
		if sqlPool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return nil, fmt.Errorf("open the sql handler's pool: %w", err)
		}
	}
	closeSQL := func() {
		if sqlPool != nil {
			sqlPool.Close()
		}
	}
	if err := builtin.Register(reg, builtin.Options{Pool: sqlPool, AllowExec: allowExec, HTTPGuard: guard}); err != nil {
		closeSQL()
		return nil, err
	}
	client, err := stepready.NewClient(pool, d.config(reg, logger, metrics))
	if err != nil {
		closeSQL()
		return nil, usageError{err}
	}
	if err := client.Start(ctx); err != nil {
		closeSQL()
		return nil, err
	}
	if sqlPool != nil {
		// Closed once the client has stopped: its last attempts may still be running step SQL until then.
		go func() {
			<-ctx.Done()
			<-client.Stopped()
			sqlPool.Close()
		}()
	}
	return client, nil
}

// watchSignals is armed while a daemon shuts down gracefully after the first SIGINT/SIGTERM (which cancels the
// command's context): it says so, and a second signal ends the process at once with status 1. The returned
// function disarms it.
func (o *globalOptions) watchSignals() (disarm func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		received := 0
		for {
			select {
			case <-done:
				return
			case sig := <-sigs:
				received++
				if received == 1 {
					fmt.Fprintf(o.stderr, "scheduler: %s: stopping gracefully; send it again to exit at once\n", sig)
					continue
				}
				fmt.Fprintf(o.stderr, "scheduler: %s again: exiting at once\n", sig)
				o.exit(1)
				return
			}
		}
	})
	return func() {
		signal.Stop(sigs)
		close(done)
		wg.Wait()
	}
}
