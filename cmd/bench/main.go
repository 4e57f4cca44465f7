// Command bench runs stepready's benchmarks on throwaway local PostgreSQL clusters and prints one table (profile,
// scenario, figure, baseline, ratio, target, met) plus bench.json. Every figure is compared with a baseline
// measured in the same run on the same cluster. Each profile gets a cluster of its own: durable (the server's
// defaults, reported first) then fast (crash safety off). `make bench` runs the full size, `make bench-quick` the
// small one.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"

	"github.com/stepready/stepready/internal/bench"
)

func main() {
	sizeName := flag.String("size", "quick", "quick or full")
	out := flag.String("json", "bench.json", "where to write the JSON report (empty: nowhere)")
	verbose := flag.Bool("v", false, "log progress")
	only := flag.String("only", "", "comma-separated scenario names to run (default: all): "+
		strings.Join(bench.ScenarioNames(), ", "))
	var opts bench.Options
	flag.StringVar(&opts.QueryExecMode, "query-exec-mode", "", "pgx's default_query_exec_mode of every pool and "+
		"daemon: cache_statement (pgx's default), cache_describe, describe_exec, exec or simple_protocol")
	flag.BoolVar(&opts.PollOnly, "poll-only", false, "stepready clients poll only (no LISTEN); scenario 3 polls every 100 ms")
	flag.BoolVar(&opts.PgBouncer, "pgbouncer", false, "connect through a PgBouncer in transaction pooling mode "+
		"(needs pgbouncer installed; implies -poll-only)")
	profiles := flag.String("profile", strings.Join(bench.Profiles, ","), "comma-separated profiles to measure, in "+
		"order, each on a cluster of its own: durable (the server's defaults: fsync, synchronous_commit, "+
		"full_page_writes, JIT, autovacuum) and fast (crash safety off, as in the tests)")
	serverDefaults := flag.Bool("server-defaults", false, "the durable profile only (same as -profile durable)")
	flag.Parse()
	if *serverDefaults {
		*profiles = bench.ProfileDurable
	}
	var keep func(string) bool
	if *only != "" {
		names := strings.Split(*only, ",")
		for i, n := range names {
			names[i] = strings.TrimSpace(n)
			if !slices.Contains(bench.ScenarioNames(), names[i]) {
				fmt.Fprintf(os.Stderr, "bench: -only: unknown scenario %q (known: %s)\n", names[i],
					strings.Join(bench.ScenarioNames(), ", "))
				os.Exit(2)
			}
		}
		keep = func(name string) bool { return slices.Contains(names, name) }
	}
	size, ok := bench.Sizes[*sizeName]
	if !ok {
		fmt.Fprintf(os.Stderr, "bench: unknown size %q (quick or full)\n", *sizeName)
		os.Exit(2)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.RunProfiles(ctx, size, logger, keep, opts, strings.Split(*profiles, ","))
	if rep != nil {
		rep.Print(os.Stdout)
		if *out != "" {
			if werr := rep.WriteJSON(*out); werr != nil {
				fmt.Fprintln(os.Stderr, "bench:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
