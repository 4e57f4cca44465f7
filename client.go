// Package stepready is the library API of the stepready scheduler: a Client that claims ready steps from the
// stepready schema, dispatches them (through River or in-process) to the handlers of a steps.Registry, and
// records their outcomes. `scheduler run` is a thin command over it; programs that embed stepready register
// their own handlers and start a Client of their own.
package stepready

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepready/stepready/steps"
)

// Dispatch modes.
const (
	// DispatchRiver inserts claimed steps as River jobs in the claim's transaction; any process running a Client
	// against the database works them. The default.
	DispatchRiver = "river"
	// DispatchDirect runs claimed steps in this process's own worker pool.
	DispatchDirect = "direct"
)

// Config defaults.
const (
	ConcurrencyDefault   = 10
	LeaseDefault         = 30 * time.Second
	LeaseMin             = 300 * time.Millisecond
	ReapIntervalDefault  = 10 * time.Second
	PollIntervalDefault  = 5 * time.Second
	ShutdownGraceDefault = 10 * time.Second
	// RetentionCompleteDefault is how long complete tasks are kept after they finished (SPEC §13): a week.
	RetentionCompleteDefault = 168 * time.Hour
	// RetentionFailedDefault is how long error and cancelled tasks are kept after they finished: 30 days.
	RetentionFailedDefault = 720 * time.Hour
	// PruneIntervalDefault is how often the elected instance prunes finished tasks.
	PruneIntervalDefault = time.Minute
	// KeepForever, as a retention, disables pruning of those tasks.
	KeepForever time.Duration = -1
)

// Config configures a Client. Zero values take the documented defaults.
type Config struct {
	// Registry holds the handlers this client can run. Required.
	Registry *steps.Registry
	// Dispatch is DispatchRiver (default) or DispatchDirect.
	Dispatch string
	// Concurrency is the number of attempts this client runs at once (default 10). Claims never exceed the
	// free capacity.
	Concurrency int
	// Lease is the attempt lease (default 30 s, at least 300 ms). A worker heartbeats every Lease/3; an attempt
	// whose worker died is retried within Lease + ReapInterval.
	Lease time.Duration
	// ReapInterval is how often the elected instance reaps expired leases (default 10 s; must be shorter than
	// Lease).
	ReapInterval time.Duration
	// PollInterval is the fallback poll when no notification or timer wakes the claimer (default 5 s).
	PollInterval time.Duration
	// ShutdownGrace is how long Stop lets running attempts finish before cancelling and releasing them
	// (default 10 s).
	ShutdownGrace time.Duration
	// WorkerID names this process in leases and events (default hostname-pid).
	WorkerID string
	// PollOnly is for PgBouncer in transaction pooling mode (docs/daemon.md, "Behind PgBouncer"): no LISTEN
	// (the poll interval and the timer of due steps carry the latency; River's producers poll every
	// PollInterval, at most 1 s), and no named prepared statement: unless the pool's URL names
	// default_query_exec_mode (or its configuration sets another mode than pgx's default), the client opens a
	// pool of its own with the pool's configuration in pgx's exec mode, used by everything it runs, River's
	// client included, and closed by Stop. Nothing the client runs depends on session state across
	// transactions.
	PollOnly bool
	// DefaultTimeout is the attempt timeout of steps without timeout_ms (default steps.DefaultTimeout).
	DefaultTimeout time.Duration
	// RetentionComplete is how long complete tasks (with their steps and events) are kept after they finished
	// before the elected instance deletes them (default RetentionCompleteDefault, a week; KeepForever or any
	// negative value keeps them forever).
	RetentionComplete time.Duration
	// RetentionFailed is the same for error and cancelled tasks (default RetentionFailedDefault, 30 days;
	// KeepForever keeps them).
	RetentionFailed time.Duration
	// PruneInterval is how often the elected instance prunes (default PruneIntervalDefault, a minute). Each round
	// deletes in batches of 1,000 tasks until none is left past its retention.
	PruneInterval time.Duration
	// MaxOutputBytes is the largest output (encoded as JSON) an attempt may record; a larger one fails the attempt
	// as contract_failure naming the size (SPEC §17). Default steps.MaxOutputBytesDefault (1 MiB); negative: no
	// limit.
	MaxOutputBytes int
	// Logger receives the client's logs (nil: discarded).
	Logger *slog.Logger
	// Metrics, when set, receives the client's Prometheus collectors.
	Metrics prometheus.Registerer
}

func (c Config) withDefaults() Config {
	c.Dispatch = cmp.Or(c.Dispatch, DispatchRiver)
	c.Concurrency = cmp.Or(c.Concurrency, ConcurrencyDefault)
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	c.ReapInterval = cmp.Or(c.ReapInterval, ReapIntervalDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, ShutdownGraceDefault)
	c.DefaultTimeout = cmp.Or(c.DefaultTimeout, steps.DefaultTimeout)
	c.RetentionComplete = cmp.Or(c.RetentionComplete, RetentionCompleteDefault)
	c.RetentionFailed = cmp.Or(c.RetentionFailed, RetentionFailedDefault)
	c.PruneInterval = cmp.Or(c.PruneInterval, PruneIntervalDefault)
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		c.WorkerID = cmp.Or(host, "stepready") + "-" + strconv.Itoa(os.Getpid())
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Registry == nil {
		errs = append(errs, errors.New("config.Registry is required"))
	}
	if c.Dispatch != DispatchRiver && c.Dispatch != DispatchDirect {
		errs = append(errs, fmt.Errorf("config.Dispatch must be %q or %q, got %q", DispatchRiver, DispatchDirect, c.Dispatch))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("config.Concurrency must be >= 1, got %d", c.Concurrency))
	}
	if c.Lease < LeaseMin {
		errs = append(errs, fmt.Errorf("config.Lease must be >= %s, got %s", LeaseMin, c.Lease))
	}
	if c.ReapInterval <= 0 || c.ReapInterval >= c.Lease {
		errs = append(errs, fmt.Errorf("config.ReapInterval must be > 0 and shorter than Lease (%s), got %s", c.Lease, c.ReapInterval))
	}
	if c.PollInterval <= 0 {
		errs = append(errs, fmt.Errorf("config.PollInterval must be > 0, got %s", c.PollInterval))
	}
	if c.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("config.ShutdownGrace must be >= 0, got %s", c.ShutdownGrace))
	}
	if c.PruneInterval <= 0 {
		errs = append(errs, fmt.Errorf("config.PruneInterval must be > 0, got %s", c.PruneInterval))
	}
	if c.DefaultTimeout <= 0 {
		errs = append(errs, fmt.Errorf("config.DefaultTimeout must be > 0, got %s", c.DefaultTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stepready: invalid config: %w", err)
	}
	return nil
}

// Client claims, dispatches and runs steps. Create it with NewClient, then Start; Stop shuts it down gracefully.
type Client struct {
	pool *pgxpool.Pool
	cfg  Config

	mu  sync.Mutex // guards svc
	svc *service
}

// NewClient checks cfg and builds a client on pool. The pool's database must be migrated (scheduler migrate up).
func NewClient(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("stepready: NewClient: nil pool")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Client{pool: pool, cfg: cfg}, nil
}

// Config returns the client's configuration with defaults applied.
func (c *Client) Config() Config { return c.cfg }
