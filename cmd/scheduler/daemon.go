package main

import (
	"context"
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
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// daemonFlags are the flags of the client configuration, shared by `run` and `demo`. Their defaults are the
// root package's.
type daemonFlags struct {
	dispatch      string
	concurrency   int
	lease         time.Duration
	reapInterval  time.Duration
	pollInterval  time.Duration
	shutdownGrace time.Duration
	workerID      string
	pollOnly      bool
	// Retention (SPEC §13): 0 keeps those tasks forever.
	retentionComplete time.Duration
	retentionFailed   time.Duration
	pruneInterval     time.Duration
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
	fs.IntVar(&d.concurrency, "concurrency", stepready.ConcurrencyDefault,
		"attempts this process runs at once; claims never exceed the free capacity")
	fs.DurationVar(&d.lease, "lease", stepready.LeaseDefault, fmt.Sprintf("attempt lease, renewed every "+
		"lease/3; an attempt whose worker died is retried within lease + reap interval (at least %s)", stepready.LeaseMin))
	fs.DurationVar(&d.reapInterval, "reap-interval", stepready.ReapIntervalDefault,
		"how often the elected instance reaps expired leases; shorter than --lease")
	fs.DurationVar(&d.pollInterval, "poll-interval", stepready.PollIntervalDefault,
		"fallback poll for ready steps when no notification or retry timer wakes the claimer")
	fs.DurationVar(&d.shutdownGrace, "shutdown-grace", stepready.ShutdownGraceDefault,
		"at SIGINT/SIGTERM, how long running attempts may finish before they are cancelled and handed back uncharged")
	fs.StringVar(&d.workerID, "worker-id", "", "this process's name in leases and events")
	setDefaultText(fs, "worker-id", "hostname-pid")
	fs.BoolVar(&d.pollOnly, "poll-only", false,
		"never LISTEN, only poll (for PgBouncer in transaction pooling mode)")
	fs.DurationVar(&d.retentionComplete, "retention-complete", stepready.RetentionCompleteDefault,
		"how long complete tasks are kept after they finished, with their steps and events; 0 keeps them forever")
	fs.DurationVar(&d.retentionFailed, "retention-failed", stepready.RetentionFailedDefault,
		"how long error and cancelled tasks are kept after they finished; 0 keeps them forever")
	fs.DurationVar(&d.pruneInterval, "prune-interval", stepready.PruneIntervalDefault,
		"how often the elected instance deletes the finished tasks past their retention")
	fs.IntVar(&d.maxOutputBytes, "max-output-bytes", steps.MaxOutputBytesDefault,
		"the largest output (as JSON) an attempt may record; a larger one fails it as contract_failure")
	fs.StringVar(&d.sqlDatabaseURL, "sql-database-url", "",
		"database URL the sql handler runs step SQL on, with a pool of its own (pool_max_conns in the URL, default 4);\n"+
			"without it sql steps fail permanent: step SQL never runs on the scheduler's connection")
	fs.BoolVar(&d.httpDenyPrivate, "http-deny-private", false,
		"the http handler also refuses loopback and private addresses (link-local, cloud metadata, always)")
	fs.StringSliceVar(&d.httpAllowHosts, "http-allow-hosts", nil,
		"exceptions to the http handler's guard: host names, IP addresses or CIDR prefixes, comma-separated")
}

// keep maps a retention flag to Config: 0 on the command line keeps forever.
func keep(d time.Duration) time.Duration {
	if d == 0 {
		return stepready.KeepForever
	}
	return d
}

// validate checks the flags, naming the flag at fault; its errors are usage errors.
func (d *daemonFlags) validate() error {
	switch {
	case d.dispatch != stepready.DispatchRiver && d.dispatch != stepready.DispatchDirect:
		return usagef("--dispatch %q: want %s or %s", d.dispatch, stepready.DispatchRiver, stepready.DispatchDirect)
	case d.concurrency < 1:
		return usagef("--concurrency %d: must be 1 or more", d.concurrency)
	case d.lease < stepready.LeaseMin:
		return usagef("--lease %s: must be at least %s", d.lease, stepready.LeaseMin)
	case d.reapInterval <= 0:
		return usagef("--reap-interval %s: must be more than 0", d.reapInterval)
	case d.reapInterval >= d.lease:
		return usagef("--reap-interval %s: must be shorter than --lease (%s)", d.reapInterval, d.lease)
	case d.pollInterval <= 0:
		return usagef("--poll-interval %s: must be more than 0", d.pollInterval)
	case d.shutdownGrace < 0:
		return usagef("--shutdown-grace %s: must be 0 or more", d.shutdownGrace)
	case d.retentionComplete < 0:
		return usagef("--retention-complete %s: must be 0 (keep forever) or more", d.retentionComplete)
	case d.retentionFailed < 0:
		return usagef("--retention-failed %s: must be 0 (keep forever) or more", d.retentionFailed)
	case d.maxOutputBytes < 1:
		return usagef("--max-output-bytes %d: must be 1 or more", d.maxOutputBytes)
	case d.pruneInterval <= 0:
		return usagef("--prune-interval %s: must be more than 0", d.pruneInterval)
	case strings.TrimSpace(d.workerID) != d.workerID:
		return usagef("--worker-id %q: no leading or trailing spaces", d.workerID)
	}
	return nil
}

// config is the client configuration of the flags.
func (d *daemonFlags) config(reg *steps.Registry, logger *slog.Logger, metrics prometheus.Registerer) stepready.Config {
	return stepready.Config{
		Registry:          reg,
		Dispatch:          d.dispatch,
		Concurrency:       d.concurrency,
		Lease:             d.lease,
		ReapInterval:      d.reapInterval,
		PollInterval:      d.pollInterval,
		ShutdownGrace:     d.shutdownGrace,
		WorkerID:          d.workerID,
		PollOnly:          d.pollOnly,
		RetentionComplete: keep(d.retentionComplete),
		RetentionFailed:   keep(d.retentionFailed),
		PruneInterval:     d.pruneInterval,
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

// openPool opens and checks the pool of a daemon (see daemonPoolSize), failing at once when the database does
// not answer. `scheduler demo` uses it; `scheduler run` waits for the database instead (waitForDatabase).
func openPool(ctx context.Context, url string, concurrency int) (*pgxpool.Pool, error) {
	pool, err := newPool(ctx, url, daemonPoolSize(concurrency))
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
