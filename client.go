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
	"regexp"
	"strconv"
	"strings"
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

// QueuesDefault returns the queues a client claims when Config.Queues is empty: ["default"], the queue of every step
// that names none.
func QueuesDefault() []string { return []string{"default"} }

// queueName is a queue name as steps.queue takes it (River's rule; sql/015_bounds.sql, _queue_problem).
var queueName = regexp.MustCompile(`^[a-z0-9]+([_|-]?[a-z0-9]+)*$`)

// Config defaults.
const (
	// ConcurrencyDefault is how many attempts a client runs at once.
	ConcurrencyDefault = 10
	// LeaseDefault is the attempt lease; LeaseMin the shortest one allowed.
	LeaseDefault = 30 * time.Second
	// LeaseMin is the shortest lease Config accepts.
	LeaseMin = 300 * time.Millisecond
	// ReapIntervalDefault is how often the elected instance reaps expired leases.
	ReapIntervalDefault = 10 * time.Second
	// PollIntervalDefault is the fallback poll for ready steps.
	PollIntervalDefault = 5 * time.Second
	// ProbeIntervalDefault is how often an idle claimer reads the wake-up counter (Config.ProbeInterval).
	ProbeIntervalDefault = 25 * time.Millisecond
	// ShutdownGraceDefault is how long Stop lets running attempts finish.
	ShutdownGraceDefault = 10 * time.Second
	// RetentionCompleteDefault is how long complete tasks are kept after they finished (SPEC §13): a week.
	RetentionCompleteDefault = 7 * 24 * time.Hour
	// RetentionFailedDefault is how long error and cancelled tasks are kept after they finished: 30 days.
	RetentionFailedDefault = 30 * 24 * time.Hour
	// PruneIntervalDefault is how often the elected instance prunes finished tasks and idle flow keys.
	PruneIntervalDefault = time.Minute
	// ScheduleIntervalDefault is the longest the schedule enqueuer sleeps between two looks at the schedules.
	ScheduleIntervalDefault = time.Second
	// BacklogIntervalDefault is how often the elected instance exports the backlog gauges.
	BacklogIntervalDefault = 10 * time.Second
)

// Off, as an interval of a maintenance service (ReapInterval, PruneInterval, ScheduleInterval,
// BacklogInterval), turns that service off on this client. It is -1, as in River: a zero value takes the
// default. The command line spells it "off" (or -1).
const Off time.Duration = -1

// KeepForever, as a retention (RetentionComplete, RetentionFailed), keeps those tasks forever. It is Off (-1);
// the command line also accepts 0 for it (SPEC §13).
const KeepForever = Off

// Config configures a Client. Zero values take the documented defaults.
type Config struct {
	// Registry holds the handlers this client can run. Required.
	Registry *steps.Registry
	// Dispatch is DispatchRiver (default) or DispatchDirect.
	Dispatch string
	// Concurrency is the number of attempts this client runs at once (default 10). Claims never exceed the
	// free capacity.
	Concurrency int
	// Queues are the queues whose steps this client claims (default QueuesDefault, ["default"]); in River
	// dispatch its River client works exactly these queues. Whatever the queues, the client claims only steps whose
	// handler Registry has: a step no running client can take stays ready (SPEC §21). Each must be a queue name
	// as steps.queue takes it (docs/tables.md).
	Queues []string
	// Lease is the attempt lease (default 30 s, at least 300 ms). A worker heartbeats every Lease/3; an attempt
	// whose worker died is retried within Lease + ReapInterval.
	Lease time.Duration
	// ReapInterval is how often the elected instance reaps expired leases (default 10 s; must be shorter than
	// Lease). Off leaves reaping to other instances: with no instance reaping, the attempts of a dead worker stay
	// in flight for ever.
	ReapInterval time.Duration
	// PollInterval is the fallback poll when no notification or timer wakes the claimer (default 5 s).
	PollInterval time.Duration
	// ProbeInterval is how often the claimer reads the wake-up counter while it waits (default
	// ProbeIntervalDefault, 25 ms; Off: never). Writing transactions send no NOTIFY (it would make their commits
	// wait for each other, docs/design-core.md "Wake-ups"): they advance a counter, and a claimer that sees it
	// move claims. So a task created by plain SQL, or a step readied by another process's completion, starts
	// within about this interval when no notification announces it. Each probe reads one page of the database;
	// it also works in PollOnly mode.
	ProbeInterval time.Duration
	// ShutdownGrace is how long Stop lets running attempts finish before cancelling and releasing them
	// (default 10 s; Off: no grace, they are cancelled at once).
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
	// PruneInterval is how often the elected instance prunes (default PruneIntervalDefault, a minute; Off: never
	// on this client). Each round deletes in batches of 1,000 tasks until none is left past its retention, then
	// the state of idle flow-control keys the same way.
	PruneInterval time.Duration
	// ScheduleInterval is the longest the schedule enqueuer sleeps between rounds (default
	// ScheduleIntervalDefault, a second; Off: this client fires no schedules). Between rounds it sleeps until the
	// next fire time, so a fire is on time whatever this is; it bounds how soon a new or edited schedule is seen.
	ScheduleInterval time.Duration
	// BacklogInterval is how often the elected instance sets the backlog gauges (default BacklogIntervalDefault;
	// Off: this client exports none).
	BacklogInterval time.Duration
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
	if len(c.Queues) == 0 {
		c.Queues = QueuesDefault()
	}
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	c.ReapInterval = cmp.Or(c.ReapInterval, ReapIntervalDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.ProbeInterval = cmp.Or(c.ProbeInterval, ProbeIntervalDefault)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, ShutdownGraceDefault)
	c.DefaultTimeout = cmp.Or(c.DefaultTimeout, steps.DefaultTimeout)
	c.RetentionComplete = cmp.Or(c.RetentionComplete, RetentionCompleteDefault)
	c.RetentionFailed = cmp.Or(c.RetentionFailed, RetentionFailedDefault)
	c.PruneInterval = cmp.Or(c.PruneInterval, PruneIntervalDefault)
	c.ScheduleInterval = cmp.Or(c.ScheduleInterval, ScheduleIntervalDefault)
	c.BacklogInterval = cmp.Or(c.BacklogInterval, BacklogIntervalDefault)
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		c.WorkerID = cmp.Or(host, "stepready") + "-" + strconv.Itoa(os.Getpid())
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// ConfigError is one invalid field of a Config: Field is its name in Config (ReapInterval), Value what it held,
// Problem what is wrong. NewClient and Config.Validate return them joined (errors.As finds each).
type ConfigError struct {
	Field   string
	Value   any
	Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("config.%s %v: %s", e.Field, e.Value, e.Problem)
}

// Validate applies the defaults to c and checks it, as NewClient does; the error joins a *ConfigError per
// invalid field.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	var errs []error
	bad := func(field string, value any, problem string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Value: value, Problem: fmt.Sprintf(problem, args...)})
	}
	if c.Registry == nil {
		bad("Registry", "nil", "is required")
	}
	if c.Dispatch != DispatchRiver && c.Dispatch != DispatchDirect {
		bad("Dispatch", fmt.Sprintf("%q", c.Dispatch), "must be %q or %q", DispatchRiver, DispatchDirect)
	}
	if c.Concurrency < 1 {
		bad("Concurrency", c.Concurrency, "must be 1 or more")
	}
	seen := map[string]bool{}
	for _, q := range c.Queues {
		switch {
		case !queueName.MatchString(q) || len(q) > 64:
			bad("Queues", fmt.Sprintf("%q", q), "must be a queue name: at most 64 lowercase letters and digits, "+
				`in groups joined by one "_", "-" or "|" (as in "emails", "high-priority")`)
		case seen[q]:
			bad("Queues", fmt.Sprintf("%q", q), "is listed twice")
		}
		seen[q] = true
	}
	if c.Lease < LeaseMin {
		bad("Lease", c.Lease, "must be at least %s", LeaseMin)
	}
	if c.ReapInterval != Off && (c.ReapInterval <= 0 || c.ReapInterval >= c.Lease) {
		bad("ReapInterval", c.ReapInterval, "must be more than 0 and shorter than the lease (%s), or Off", c.Lease)
	}
	if c.PollInterval <= 0 {
		bad("PollInterval", c.PollInterval, "must be more than 0")
	}
	if c.ShutdownGrace < 0 && c.ShutdownGrace != Off {
		bad("ShutdownGrace", c.ShutdownGrace, "must be 0 or more")
	}
	for _, f := range []struct {
		name string
		d    time.Duration
		off  string
	}{
		{"PruneInterval", c.PruneInterval, "Off"}, {"ScheduleInterval", c.ScheduleInterval, "Off"},
		{"ProbeInterval", c.ProbeInterval, "Off"},
		{"BacklogInterval", c.BacklogInterval, "Off"},
		{"RetentionComplete", c.RetentionComplete, "KeepForever"}, {"RetentionFailed", c.RetentionFailed, "KeepForever"},
	} {
		if f.d <= 0 && f.d != Off {
			bad(f.name, f.d, "must be more than 0, or %s", f.off)
		}
	}
	if c.DefaultTimeout <= 0 {
		bad("DefaultTimeout", c.DefaultTimeout, "must be more than 0")
	}
	if strings.TrimSpace(c.WorkerID) != c.WorkerID {
		bad("WorkerID", fmt.Sprintf("%q", c.WorkerID), "must not start or end with spaces")
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
