// Package bench measures stepready against baselines measured in the same run on the same machine, and reports
// ratios, because absolute numbers drift on shared machines. `make bench` and `make bench-quick` run it through
// cmd/bench.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/pgcluster"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/migrations"
	"github.com/stepready/stepready/steps"
)

// Size scales every scenario.
type Size struct {
	// Name is "quick" or "full".
	Name string
	// ClaimSmall and ClaimLarge are the table sizes of the claim-cost scenario (ready steps: ClaimReady).
	ClaimSmall, ClaimLarge, ClaimReady int
	// ReadinessTasks is how many tasks sit in the tables while step_readiness is timed.
	ReadinessTasks int
	// Throughput is the number of independent no-op steps worked to completion (scenario 2).
	Throughput int
	// LatencyTasks is how many 4-step chains are timed one after the other (scenario 3).
	LatencyTasks int
	// DAGTasks is the number of diamond tasks of 4 steps worked to completion (scenario 4).
	DAGTasks int
	// StormSteps is the number of steps that fail twice before they succeed (scenario 5).
	StormSteps int
	// MemorySteps is the number of independent no-op steps the daemon child process works while its peak RSS
	// is read (scenario 6): the workload of scenario 2a, smaller in the quick size to save time.
	MemorySteps int
	// CreationRun is how long scenario 7a creates tasks one per statement (its first and last sixth are
	// compared; half as long again after CreationLoaded chains), and CreationBulkRun how long 7b runs each of
	// its two series (in three interleaved parts).
	CreationRun, CreationBulkRun time.Duration
	// CreationFlatRun is how long scenario 7d creates tasks from 10 producers (issue 34: 10 minutes at full size).
	CreationFlatRun time.Duration
	// CreationLoaded is how many chains scenario 7 bulk-loads before it measures 7a and 7b again.
	CreationLoaded int
	// CreationFileChains is how many chains scenario 7c creates from a JSON-lines file (River inserts four
	// times as many jobs).
	CreationFileChains int
	// HistorySteps is how many finished steps (with their events) sit in the tables while scenario 2 runs again.
	HistorySteps int
	// SteadyRun is how long scenario 8 creates, works and prunes tasks.
	SteadyRun time.Duration
	// FlowClaimLarge is how many keyed steps scenario 9a claims from (against 10,000).
	FlowClaimLarge int
	// PythonSteps is how many independent no-op steps the Python worker and the Go daemon each work in scenario 12.
	PythonSteps int
	// MapElements is the number of elements of scenario 10a's map (against as many independent steps), and
	// MapFanOut the number of elements of 10b's fan-out and 10c's claim.
	MapElements, MapFanOut int
	// DataflowDiamonds is the number of diamond tasks of scenario 10d (with and without outputs flowing).
	DataflowDiamonds int
	// SignalWaiting is how many tasks wait for a signal while scenario 11 measures the daemon's memory and the
	// claim.
	SignalWaiting int
}

// Sizes are the presets of cmd/bench.
var Sizes = map[string]Size{
	"quick": {Name: "quick", ClaimSmall: 10_000, ClaimLarge: 100_000, ClaimReady: 1_000, ReadinessTasks: 10_000,
		Throughput: 5_000, LatencyTasks: 50, DAGTasks: 200, StormSteps: 300, MemorySteps: 2_000,
		CreationRun: 30 * time.Second, CreationBulkRun: 6 * time.Second, CreationLoaded: 20_000, CreationFlatRun: time.Minute,
		CreationFileChains: 100_000, HistorySteps: 100_000,
		SteadyRun: time.Minute, FlowClaimLarge: 100_000, PythonSteps: 5_000, MapElements: 10_000, MapFanOut: 100_000,
		DataflowDiamonds: 1_000, SignalWaiting: 20_000},
	"full": {Name: "full", ClaimSmall: 10_000, ClaimLarge: 1_000_000, ClaimReady: 1_000, ReadinessTasks: 100_000,
		Throughput: 50_000, LatencyTasks: 200, DAGTasks: 2_000, StormSteps: 10_000, MemorySteps: 50_000,
		CreationRun: 60 * time.Second, CreationBulkRun: 21 * time.Second, CreationLoaded: 100_000,
		CreationFlatRun:    10 * time.Minute,
		CreationFileChains: 1_000_000, HistorySteps: 1_000_000,
		SteadyRun: 10 * time.Minute, FlowClaimLarge: 1_000_000, PythonSteps: 20_000, MapElements: 10_000,
		MapFanOut: 100_000, DataflowDiamonds: 5_000, SignalWaiting: 100_000},
}

// Row is one line of the report.
type Row struct {
	// Profile is the cluster's profile (ProfileDurable or ProfileFast); RunProfiles fills it.
	Profile  string  `json:"profile"`
	Scenario string  `json:"scenario"`
	Figure   string  `json:"figure"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline string  `json:"baseline,omitempty"`
	BaseVal  float64 `json:"baseline_value,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	Target   string  `json:"target"`
	Met      *bool   `json:"met,omitempty"`
}

// Report is what a run produces.
type Report struct {
	Size      string    `json:"size"`
	StartedAt time.Time `json:"started_at"`
	Postgres  string    `json:"postgres"`
	Options   Options   `json:"options"`
	// Profiles are the profiles measured, in the order of the rows.
	Profiles []string `json:"profiles"`
	// Load is the machine's 1-minute load average at the start of each profile (Linux; NaN elsewhere), so a
	// reader can tell a busy machine's figures from a quiet one's.
	Load map[string]float64 `json:"load_average,omitempty"`
	Rows []Row              `json:"rows"`
}

// Options change how every scenario connects, to measure what a deployment choice costs. The zero value is the
// default measurement.
type Options struct {
	// QueryExecMode is pgx's default_query_exec_mode of every pool and daemon of the run (cache_statement,
	// cache_describe, describe_exec, exec or simple_protocol; empty: pgx's default, cache_statement).
	QueryExecMode string `json:"query_exec_mode,omitempty"`
	// PollOnly starts every stepready client with Config.PollOnly (no LISTEN), and scenario 3 with a 100 ms poll
	// interval (latencyPollOnlyInterval) instead of 10 s.
	PollOnly bool `json:"poll_only,omitempty"`
	// PgBouncer puts a PgBouncer in transaction pooling mode between every pool and daemon of the run and the
	// cluster (migrations, database creation and scenario 3's NOTIFY baseline go direct); the scenarios' own
	// pools then use store.PoolerQueryExecMode unless QueryExecMode is set. It implies PollOnly.
	PgBouncer bool `json:"pgbouncer,omitempty"`
	// ServerDefaults starts the cluster with pgcluster.DefaultSettings (the server's own defaults: crash safety,
	// JIT, autovacuum) instead of pgcluster.FastSettings (crash safety off, as for the tests): the durable
	// profile. RunProfiles sets it per profile.
	ServerDefaults bool `json:"server_defaults,omitempty"`
}

// The benchmark profiles: the settings of the throwaway cluster a run measures on.
const (
	// ProfileDurable is a stock server: fsync, synchronous_commit, full_page_writes, JIT and autovacuum on, as
	// users run PostgreSQL. Reported first: it is what users get.
	ProfileDurable = "durable"
	// ProfileFast turns crash safety off (fsync, synchronous_commit, full_page_writes), as the tests do. Kept for
	// comparison with the figures measured before the durable profile existed, and to show what is CPU rather
	// than commit latency.
	ProfileFast = "fast"
)

// Profiles are the profiles `make bench` runs, in the order it reports them.
var Profiles = []string{ProfileDurable, ProfileFast}

// profile names the profile of opts.
func (o Options) profile() string {
	if o.ServerDefaults {
		return ProfileDurable
	}
	return ProfileFast
}

// label describes the options in a figure ("" for the default measurement).
func (o Options) label() string {
	var parts []string
	if o.PgBouncer {
		parts = append(parts, "through PgBouncer")
	}
	if o.PollOnly {
		parts = append(parts, "poll-only")
	}
	if o.QueryExecMode != "" {
		parts = append(parts, o.QueryExecMode)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// withParam returns the postgres:// URL u with the query parameter name set to value.
func withParam(u, name, value string) (string, error) {
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	q := parsed.Query()
	q.Set(name, value)
	parsed.RawQuery = q.Encode()
	return parsed.String(), nil
}

// Env is a database for one scenario.
type Env struct {
	Cluster *pgcluster.Cluster
	Logger  *slog.Logger
	Options Options
	// bouncer is the run's PgBouncer (Options.PgBouncer), else nil.
	bouncer *pgcluster.PgBouncer
	n       int
	// keepPrevious makes the next NewDB leave the previous measurement's database in place (two databases
	// measured interleaved); the caller drops it with dropDB.
	keepPrevious bool
}

// dropDB drops database bench_n (one kept by keepPrevious).
func (e *Env) dropDB(ctx context.Context, n int) error {
	admin, err := pgxpool.New(ctx, e.Cluster.URL)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS bench_%d WITH (FORCE)", n)); err != nil {
		return fmt.Errorf("bench: drop database bench_%d: %w", n, err)
	}
	return nil
}

// NewDB creates and migrates a fresh database, returning a pool with the default search_path and the URL of the
// database for other connections (both with Options.QueryExecMode, and through PgBouncer with
// Options.PgBouncer). It first drops the database of the previous measurement (measurements run one after the other and close their pools): left in
// place, its tables would be vacuumed by autovacuum during the next measurement, which would then pay for work
// of the one before.
func (e *Env) NewDB(ctx context.Context, maxConns int) (*pgxpool.Pool, string, error) {
	admin, err := pgxpool.New(ctx, e.Cluster.URL)
	if err != nil {
		return nil, "", err
	}
	defer admin.Close()
	if e.n > 0 && !e.keepPrevious {
		if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS bench_%d WITH (FORCE)", e.n)); err != nil {
			return nil, "", fmt.Errorf("bench: drop the previous database: %w", err)
		}
	}
	e.n++
	name := fmt.Sprintf("bench_%d", e.n)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, "", fmt.Errorf("bench: create database: %w", err)
	}
	url := e.Cluster.DatabaseURL(name)
	if err := migrations.Up(ctx, url, nil); err != nil {
		return nil, "", err
	}
	if e.bouncer != nil {
		if url, err = e.bouncer.URL(url); err != nil {
			return nil, "", err
		}
	}
	if e.Options.QueryExecMode != "" {
		if url, err = withParam(url, "default_query_exec_mode", e.Options.QueryExecMode); err != nil {
			return nil, "", err
		}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", err
	}
	if e.bouncer != nil {
		// The scenario's own queries (loading, waiting) go through PgBouncer too.
		store.UsePoolerQueryMode(cfg.ConnConfig)
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	return pool, url, err
}

// directURL is the URL of the newest database of NewDB straight to the cluster, without PgBouncer or
// Options.QueryExecMode.
func (e *Env) directURL() string { return e.Cluster.DatabaseURL(fmt.Sprintf("bench_%d", e.n)) }

// Run runs every scenario at size and returns the report.
func Run(ctx context.Context, size Size, logger *slog.Logger) (*Report, error) {
	return RunSelected(ctx, size, logger, nil, Options{})
}

// ScenarioNames lists the scenarios in the order Run runs them.
func ScenarioNames() []string {
	names := make([]string, len(scenarios))
	for i, sc := range scenarios {
		names[i] = sc.name
	}
	return names
}

// RunProfiles runs the scenarios whose name keep accepts (nil: all) at size with opts once per profile, each on
// a throwaway cluster of its own, in the order given (ProfileDurable first in `make bench`), and returns one
// report whose rows name their profile. Every ratio compares figures of one profile and one cluster.
func RunProfiles(ctx context.Context, size Size, logger *slog.Logger, keep func(name string) bool, opts Options,
	profiles []string) (*Report, error) {
	var all *Report
	for _, p := range profiles {
		switch p {
		case ProfileDurable:
			opts.ServerDefaults = true
		case ProfileFast:
			opts.ServerDefaults = false
		default:
			return all, fmt.Errorf("bench: unknown profile %q (%s or %s)", p, ProfileDurable, ProfileFast)
		}
		load := loadAverage()
		logger.Info("bench: profile", slog.String("profile", p), slog.Float64("load", load))
		rep, err := RunSelected(ctx, size, logger, keep, opts)
		all = mergeReport(all, p, load, rep)
		if err != nil {
			return all, err
		}
	}
	return all, nil
}

// mergeReport adds the report of one profile (nil: none) to all (nil: the first), and returns all.
func mergeReport(all *Report, profile string, load float64, rep *Report) *Report {
	if rep == nil {
		return all
	}
	if all == nil {
		all = &Report{Size: rep.Size, StartedAt: rep.StartedAt, Postgres: rep.Postgres, Options: rep.Options,
			Load: map[string]float64{}}
		all.Options.ServerDefaults = false
	}
	all.Profiles = append(all.Profiles, profile)
	all.Load[profile] = load
	all.Rows = append(all.Rows, rep.Rows...)
	return all
}

// loadAverage is the machine's 1-minute load average (NaN when /proc/loadavg cannot be read).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return math.NaN()
	}
	var l float64
	if _, err := fmt.Sscan(string(b), &l); err != nil {
		return math.NaN()
	}
	return l
}

// RunSelected runs the scenarios whose name keep accepts (nil: all) at size with opts on one cluster (the
// profile opts.ServerDefaults chooses) and returns the report.
func RunSelected(ctx context.Context, size Size, logger *slog.Logger, keep func(name string) bool, opts Options) (
	*Report, error) {
	opts.PollOnly = opts.PollOnly || opts.PgBouncer
	settings := pgcluster.FastSettings
	if opts.ServerDefaults {
		settings = pgcluster.DefaultSettings
	}
	cl, err := pgcluster.StartThrowaway(ctx, pgcluster.ThrowawayOptions{Settings: settings, Logger: logger})
	if err != nil {
		return nil, err
	}
	defer func() { _ = cl.Stop(context.Background()) }()
	env := &Env{Cluster: cl, Logger: logger, Options: opts}
	if opts.PgBouncer {
		// As many server connections as the largest pool of a scenario, so that PgBouncer adds its hop and no
		// queue.
		b, err := pgcluster.StartPgBouncer(ctx, pgcluster.PgBouncerOptions{Upstream: cl.URL, Users: []string{"postgres"},
			Settings: []string{fmt.Sprintf("default_pool_size = %d", benchPoolConns)}, Logger: logger})
		if err != nil {
			return nil, err
		}
		defer func() { _ = b.Stop() }()
		env.bouncer = b
	}
	rep := &Report{Size: size.Name, StartedAt: time.Now().UTC(), Options: opts, Profiles: []string{opts.profile()}}
	pool, err := pgxpool.New(ctx, cl.URL)
	if err == nil {
		_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&rep.Postgres)
		pool.Close()
	}
	for _, sc := range scenarios {
		if keep != nil && !keep(sc.name) {
			continue
		}
		logger.Info("bench: scenario", slog.String("name", sc.name))
		rows, err := sc.run(ctx, env, size)
		for i := range rows {
			rows[i].Profile = opts.profile()
		}
		if err != nil {
			return rep, fmt.Errorf("bench: %s (%s profile): %w", sc.name, opts.profile(), err)
		}
		rep.Rows = append(rep.Rows, rows...)
	}
	return rep, nil
}

type scenario struct {
	name string
	run  func(ctx context.Context, env *Env, size Size) ([]Row, error)
}

var scenarios = []scenario{
	{"claim cost", claimCost},
	{"step_readiness", readinessLatency},
	{"throughput", throughput},
	{"latency", latency},
	{"wake-ups", wakeups},
	{"dag throughput", dagThroughput},
	{"retry storm", retryStorm},
	{"memory", memory},
	{"creation", creation},
	{"creation over time", creationFlat},
	{"history", history},
	{"steady state", steady},
	{"flow control", flowControl},
	{"mapping", mapping},
	{"signals", signals},
	{"python worker", pythonWorker},
	{"routed claim", routedClaim},
}

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range r.Profiles {
		fmt.Fprintf(w, "profile %s: load average %.1f at its start\n", p, r.Load[p])
	}
	fmt.Fprintf(tw, "profile\tscenario\tfigure\tvalue\tbaseline\tratio\ttarget\tmet\n")
	for _, row := range r.Rows {
		met := "-"
		if row.Met != nil {
			met = map[bool]string{true: "met", false: "UNMET"}[*row.Met]
		}
		base, ratio := "-", "-"
		if row.Baseline != "" {
			base = fmt.Sprintf("%s %.4g", row.Baseline, row.BaseVal)
			ratio = fmt.Sprintf("%.2f", row.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4g %s\t%s\t%s\t%s\t%s\n", row.Profile, row.Scenario, row.Figure, row.Value, row.Unit, base,
			ratio, row.Target, met)
	}
	_ = tw.Flush()
}

// WriteJSON writes the report to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// percentile returns the p-th percentile (0 < p <= 100) of ds by the nearest-rank method: the smallest value
// with at least p % of the values at or below it. It returns 0 for no values.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// millis converts a duration to fractional milliseconds for the report.
func millis(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func boolp(b bool) *bool { return &b }

// runClient works the steps already loaded in pool with a stepready Client (dispatch mode, the concurrency and
// poll interval of scenario 2) until the want tasks in the database are complete. It returns the time from Start
// until waitTasks saw the last completion.
func runClient(ctx context.Context, env *Env, pool *pgxpool.Pool, reg *steps.Registry, mode string, want int) (time.Duration, error) {
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: mode, Concurrency: benchConcurrency,
		PollInterval: time.Second, PollOnly: env.Options.PollOnly, Logger: env.Logger.With("component", "client")})
	if err != nil {
		return 0, err
	}
	begin := time.Now()
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	err = waitTasks(ctx, pool, want, 10*time.Minute, nil)
	elapsed := time.Since(begin)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if stopErr := c.Stop(stopCtx); err == nil && stopErr != nil {
		err = fmt.Errorf("stop client: %w", stopErr)
	}
	return elapsed, err
}

// errExited is returned by waitTasks when the process doing the work exits first.
var errExited = errors.New("the worker exited")

// waitTasks polls every 10 ms until no step is left to run, then checks that want tasks are complete. The poll is
// two probes of the partial step indexes (steps in flight; claimable steps, due or waiting on a backoff), whose
// cost does not grow with the number of finished tasks (a count of complete tasks over tens of thousands of rows
// would take several milliseconds of the database's time at every poll, a load on the very thing being
// measured; tasks have no status index since schema version 2). A step blocked behind an unfinished parent has a
// claimable or running ancestor, so an empty probe means every task of the run has ended. It gives up after
// limit, or with errExited once exited (which may be nil) is closed.
func waitTasks(ctx context.Context, pool *pgxpool.Pool, want int, limit time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(limit)
	for {
		var busy bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stepready.steps
			WHERE state IN ('enqueued', 'in_progress'))
			OR EXISTS (SELECT 1 FROM stepready.steps
			WHERE state IN ('pending', 'waiting_for_retry') AND pending_parents = 0 AND NOT task_held)`).Scan(&busy); err != nil {
			return err
		}
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tasks still pending or in progress after %s", limit)
		}
		select {
		case <-exited:
			return errExited
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	var complete int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks WHERE status = 'complete'`).Scan(&complete); err != nil {
		return err
	}
	if complete != want {
		return fmt.Errorf("%d tasks complete, want %d (the others ended in error or were cancelled)", complete, want)
	}
	return nil
}

// repeatRuns is how many times the throughput scenarios (2, 4, 5) run each of their measurements; the report
// shows the median. Single runs on these shared two-core machines drift by ±10 % from one to the next, as much as
// the margin of several targets.
const repeatRuns = 3

// medians runs every measurement repeatRuns times, interleaved (all of them once, then again), so that a slow
// period of the machine hits every series alike, and returns the median of each.
func medians(runs ...func() (float64, error)) ([]float64, error) {
	got := make([][]float64, len(runs))
	for range repeatRuns {
		for i, run := range runs {
			v, err := run()
			if err != nil {
				return nil, err
			}
			got[i] = append(got[i], v)
		}
	}
	out := make([]float64, len(runs))
	for i, vs := range got {
		sort.Float64s(vs)
		out[i] = vs[len(vs)/2]
	}
	return out, nil
}
