// Command peers runs stepready side by side with DBOS Transact for Go on one throwaway PostgreSQL with the server's
// defaults (the durable profile: fsync, synchronous_commit, full_page_writes, JIT, autovacuum on) and prints one
// table: each scenario's figure for both, measured in interleaved rounds at equal concurrency, with the median
// and the ratio stepready / DBOS (or DBOS / stepready where lower is better, so that > 1 always means stepready
// is ahead). `make bench-peers` runs it; it is a module of its own (bench/peers/go.mod) so that the product's
// go.mod never depends on DBOS. docs/benchmarks.md reads its output.
//
// The scenarios are those of issue 34: enqueue with 10 producers; end to end with workers running; a 4-step chain
// one at a time; a signal (the call, and send → next step started); a backlog drained; 2,000 chains in flight;
// a fan-out of 100 and its join; 10,000 runs waiting (the worker process's RSS, goroutines, backends); and kill -9
// with chains in flight, then a restart (time until all finish, step bodies run twice).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/pgcluster"
)

// size scales every scenario.
type size struct {
	Name       string
	Rounds     int           // interleaved rounds of each measurement (median reported)
	Window     time.Duration // how long the enqueue scenario's producers run per round
	EndToEnd   int           // runs created by the producers while the workers run
	Chains     int           // 4-step chains timed one at a time
	Signals    int           // signals timed one at a time
	Backlog    int           // one-step runs drained
	InFlight   int           // 4-step chains in flight at once
	FanOuts    int           // fan-outs of 100 + join timed one at a time
	Waiting    int           // runs waiting for a signal while the worker process is measured
	KillChains int           // 4-step chains in flight at the kill
}

var sizes = map[string]size{
	"quick": {Name: "quick", Rounds: 3, Window: 5 * time.Second, EndToEnd: 1000, Chains: 30, Signals: 30, Backlog: 2000,
		InFlight: 500, FanOuts: 5, Waiting: 2000, KillChains: 200},
	"full": {Name: "full", Rounds: 5, Window: 10 * time.Second, EndToEnd: 5000, Chains: 100, Signals: 100,
		Backlog: 10000, InFlight: 2000, FanOuts: 10, Waiting: 10000, KillChains: 1000},
}

// concurrency is the workers' concurrency on both sides (stepready Config.Concurrency, DBOS queue worker
// concurrency), and producers the number of goroutines that enqueue.
const (
	concurrency = 10
	producers   = 10
)

// row is one line of the report.
type row struct {
	Scenario string  `json:"scenario"`
	Figure   string  `json:"figure"`
	Unit     string  `json:"unit"`
	Stepr    float64 `json:"stepready"`
	DBOS     float64 `json:"dbos"`
	// HigherBetter says which way the ratio is taken: stepready/DBOS when higher is better, DBOS/stepready when
	// lower is better, so a ratio above 1 is always stepready ahead.
	HigherBetter bool    `json:"higher_is_better"`
	Ratio        float64 `json:"ratio"`
	Target       string  `json:"target,omitempty"`
	Met          *bool   `json:"met,omitempty"`
	Load         float64 `json:"load_average"`
}

type env struct {
	cl      *pgcluster.Cluster
	logger  *slog.Logger
	n       int
	size    size
	bin     string // this program, re-run as a worker process (child.go)
	tmp     string
	workMS  int
	verbose bool
}

// newDB creates an empty database and returns its URL.
func (e *env) newDB(ctx context.Context, prefix string) (string, error) {
	admin, err := pgxpool.New(ctx, e.cl.URL)
	if err != nil {
		return "", err
	}
	defer admin.Close()
	e.n++
	name := fmt.Sprintf("%s_%d", prefix, e.n)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return e.cl.DatabaseURL(name), nil
}

type scenario struct {
	name string
	run  func(ctx context.Context, e *env) ([]row, error)
}

var scenarios = []scenario{
	{"enqueue", enqueueScenario},
	{"end to end", endToEndScenario},
	{"chain", chainScenario},
	{"signal", signalScenario},
	{"backlog", backlogScenario},
	{"in flight", inFlightScenario},
	{"fan-out", fanOutScenario},
	{"waiting", waitingScenario},
	{"kill", killScenario},
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		os.Exit(childMain(os.Args[2:]))
	}
	sizeName := flag.String("size", "quick", "quick or full")
	out := flag.String("json", "bench-peers.json", "where to write the JSON report (empty: nowhere)")
	verbose := flag.Bool("v", false, "log progress")
	var names []string
	for _, s := range scenarios {
		names = append(names, s.name)
	}
	only := flag.String("only", "", "comma-separated scenarios (default: all): "+strings.Join(names, ", "))
	flag.Parse()
	sz, ok := sizes[*sizeName]
	if !ok {
		fmt.Fprintf(os.Stderr, "peers: unknown size %q\n", *sizeName)
		os.Exit(2)
	}
	var keep []string
	if *only != "" {
		for _, n := range strings.Split(*only, ",") {
			n = strings.TrimSpace(n)
			if !slices.Contains(names, n) {
				fmt.Fprintf(os.Stderr, "peers: -only: unknown scenario %q (known: %s)\n", n, strings.Join(names, ", "))
				os.Exit(2)
			}
			keep = append(keep, n)
		}
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rows, err := run(ctx, sz, logger, keep, *verbose)
	print(os.Stdout, sz, rows)
	if *out != "" && len(rows) > 0 {
		b, _ := json.MarshalIndent(map[string]any{"size": sz.Name, "profile": "durable", "rows": rows}, "", "  ")
		if werr := os.WriteFile(*out, append(b, '\n'), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "peers:", werr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, sz size, logger *slog.Logger, keep []string, verbose bool) ([]row, error) {
	cl, err := pgcluster.StartThrowaway(ctx, pgcluster.ThrowawayOptions{Settings: pgcluster.DefaultSettings, Logger: logger})
	if err != nil {
		return nil, err
	}
	defer func() { _ = cl.Stop(context.Background()) }()
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// Not named stepready-…: other tools clean abandoned stepready-* directories of the temporary directory.
	tmp, err := os.MkdirTemp("", "peers-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	e := &env{cl: cl, logger: logger, size: sz, bin: bin, tmp: tmp, workMS: 20, verbose: verbose}
	var rows []row
	for _, sc := range scenarios {
		if keep != nil && !slices.Contains(keep, sc.name) {
			continue
		}
		logger.Info("peers: scenario", slog.String("name", sc.name), slog.Float64("load", loadAverage()))
		got, err := sc.run(ctx, e)
		rows = append(rows, got...)
		if err != nil {
			return rows, fmt.Errorf("%s: %w", sc.name, err)
		}
	}
	return rows, nil
}

// measure builds a row from both sides' samples: the median of each.
func measure(scenario, figure, unit string, higherBetter bool, sr, db []float64, target string,
	ok func(ratio float64) bool) row {
	r := row{Scenario: scenario, Figure: figure, Unit: unit, Stepr: medianOf(sr), DBOS: medianOf(db),
		HigherBetter: higherBetter, Target: target, Load: loadAverage()}
	switch {
	case higherBetter && r.DBOS > 0:
		r.Ratio = r.Stepr / r.DBOS
	case !higherBetter && r.Stepr > 0:
		r.Ratio = r.DBOS / r.Stepr
	}
	if ok != nil {
		met := ok(r.Ratio)
		r.Met = &met
	}
	return r
}

// atLeast is a target on the ratio.
func atLeast(x float64) func(float64) bool { return func(r float64) bool { return r >= x } }

// interleave runs each measurement rounds times, one of each per round, so a slow period of the machine hits both
// sides alike; it returns every sample of each.
func interleave(rounds int, runs ...func() (float64, error)) ([][]float64, error) {
	got := make([][]float64, len(runs))
	for range rounds {
		for i, r := range runs {
			v, err := r()
			if err != nil {
				return nil, err
			}
			got[i] = append(got[i], v)
		}
	}
	return got, nil
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func millis(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func durationsMS(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = millis(d)
	}
	return out
}

// loadAverage is the 1-minute load average (0 when unreadable).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscan(string(b), &l)
	return l
}

func print(w *os.File, sz size, rows []row) {
	fmt.Fprintf(w, "peers, size %s, profile durable (server defaults), %d producers, concurrency %d\n", sz.Name,
		producers, concurrency)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\tfigure\tstepready\tDBOS\tratio (>1: stepready ahead)\ttarget\tmet\tload\n")
	for _, r := range rows {
		met := "-"
		if r.Met != nil {
			met = map[bool]string{true: "met", false: "UNMET"}[*r.Met]
		}
		fmt.Fprintf(tw, "%s\t%s\t%.4g %s\t%.4g %s\t%.2f\t%s\t%s\t%.1f\n", r.Scenario, r.Figure, r.Stepr, r.Unit, r.DBOS,
			r.Unit, r.Ratio, r.Target, met, r.Load)
	}
	_ = tw.Flush()
}
