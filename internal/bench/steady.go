package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// steadyRetention is the retention of scenario 8: complete tasks are pruned 10 s after they finish.
const steadyRetention = 10 * time.Second

// steady is scenario 8, a daemon living for a while: 4-step chains created through stepready.CreateTasks at a
// fixed offered load, worked by a direct-dispatch Client that prunes them 10 s after they complete, for
// size.SteadyRun. It compares the completions of the last window with the first (the rate must hold) and the
// size of tasks + steps + step_events at the end with the half-way mark (retention must hold the tables
// steady), and reports this process's resident set at both points.
//
// The offered load is the issue's: half of scenario 2's direct rate on this machine, measured first (a run of
// 2a), in steps, so a quarter of that in 4-step chains per second.
func steady(ctx context.Context, env *Env, size Size) ([]Row, error) {
	direct, err := throughputClient(ctx, env, size.Throughput, stepready.DispatchDirect)
	if err != nil {
		return nil, fmt.Errorf("scenario 2a first: %w", err)
	}
	pool, _, err := env.NewDB(ctx, benchPoolConns)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	const batch = 100
	defs := make([]json.RawMessage, batch)
	for i := range defs {
		defs[i] = chainDefinition
	}
	offered := direct / 2 / 4 // tasks/s
	every := time.Duration(float64(time.Second) * batch / offered)
	created := 0

	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) { return s.Input, nil }))
	metrics := prometheus.NewRegistry()
	c, err := stepready.NewClient(pool, stepready.Config{Registry: reg, Dispatch: stepready.DispatchDirect,
		Concurrency: benchConcurrency, PollInterval: time.Second, RetentionComplete: steadyRetention,
		PruneInterval: time.Second, PollOnly: env.Options.PollOnly, Logger: env.Logger.With("component", "client"),
		Metrics: metrics})
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx)
	}()

	window := size.SteadyRun / 10
	completedAt := func() (float64, error) {
		mfs, err := metrics.Gather()
		if err != nil {
			return 0, err
		}
		for _, mf := range mfs {
			if mf.GetName() == "stepready_attempts_completed_total" {
				return sumCounter(mf.GetMetric()), nil
			}
		}
		return 0, nil
	}
	tableSize := func() (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, `SELECT pg_total_relation_size('stepready.tasks') + pg_total_relation_size('stepready.steps')
			+ pg_total_relation_size('stepready.step_events')`).Scan(&n)
		return n, err
	}
	var firstDone, lastStart, lastDone float64
	var halfSize, endSize int64
	var halfRSS, endRSS int64
	var halfDead vacuumState
	start := time.Now()
	next := start
	halfTaken := false
	for time.Since(start) < size.SteadyRun {
		if _, err := stepready.CreateTasks(ctx, pool, defs); err != nil {
			return nil, fmt.Errorf("create tasks: %w", err)
		}
		created += batch
		elapsed := time.Since(start)
		if firstDone == 0 && elapsed >= window {
			if firstDone, err = completedAt(); err != nil {
				return nil, err
			}
		}
		if !halfTaken && elapsed >= size.SteadyRun/2 {
			halfTaken = true
			if halfSize, err = tableSize(); err != nil {
				return nil, err
			}
			halfRSS = selfRSS()
			if halfDead, err = deadRows(ctx, pool); err != nil {
				return nil, err
			}
		}
		if lastStart == 0 && elapsed >= size.SteadyRun-window {
			if lastStart, err = completedAt(); err != nil {
				return nil, err
			}
		}
		// On schedule; when creation falls behind it catches up without sleeping (the achieved rate is reported).
		next = next.Add(every)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Until(next)):
		}
	}
	achieved := float64(created) / time.Since(start).Seconds()
	if lastDone, err = completedAt(); err != nil {
		return nil, err
	}
	if endSize, err = tableSize(); err != nil {
		return nil, err
	}
	endRSS = selfRSS()
	endDead, err := deadRows(ctx, pool)
	if err != nil {
		return nil, err
	}
	var kept int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&kept); err != nil {
		return nil, err
	}
	first, last := firstDone/window.Seconds(), (lastDone-lastStart)/window.Seconds()
	rate := last / first
	growth := float64(endSize) / float64(max(halfSize, 1))
	mb := func(b int64) float64 { return float64(b) / 1e6 }
	return []Row{
		{Scenario: "8 steady state", Figure: fmt.Sprintf("steps/s completed in the last %s over the first, %s at %.0f chains/s offered (half of 2a's %.0f steps/s; %.0f chains/s created), retention %s%s",
			window, size.SteadyRun, offered, direct, achieved, steadyRetention, env.Options.label()), Value: last, Unit: "steps/s", Baseline: "first window",
			BaseVal: first, Ratio: rate, Target: ">= 0.95", Met: boolp(rate >= 0.95)},
		{Scenario: "8 steady state", Figure: fmt.Sprintf("size of tasks + steps + step_events at the end over the half-way mark (%d tasks kept at the end)", kept),
			Value: mb(endSize), Unit: "MB", Baseline: "half-way", BaseVal: mb(halfSize), Ratio: growth,
			Target: "<= 1.2", Met: boolp(growth <= 1.2)},
		{Scenario: "8 steady state", Figure: fmt.Sprintf("dead rows of tasks + steps + step_events at the end (baseline: "+
			"half-way), %d autovacuum runs of them by the end (%d by half-way): what retention leaves to autovacuum",
			endDead.vacuums, halfDead.vacuums), Value: float64(endDead.dead), Unit: "rows", Baseline: "half-way",
			BaseVal: float64(halfDead.dead), Ratio: float64(endDead.dead) / float64(max(halfDead.dead, 1)), Target: "(reported)"},
		{Scenario: "8 steady state", Figure: "resident set of the process running the daemon, at the end (baseline: half-way)",
			Value: float64(endRSS) / 1e3, Unit: "MB", Baseline: "half-way", BaseVal: float64(halfRSS) / 1e3,
			Ratio: float64(endRSS) / float64(max(halfRSS, 1)), Target: "(reported)"},
	}, nil
}

// vacuumState is what autovacuum has left and done on the tables of scenario 8.
type vacuumState struct{ dead, vacuums int64 }

// deadRows reads the dead rows and the autovacuum runs of tasks, steps and step_events.
func deadRows(ctx context.Context, pool *pgxpool.Pool) (vacuumState, error) {
	var v vacuumState
	err := pool.QueryRow(ctx, `SELECT COALESCE(sum(n_dead_tup), 0)::bigint, COALESCE(sum(autovacuum_count), 0)::bigint
		  FROM pg_catalog.pg_stat_user_tables
		 WHERE schemaname = 'stepready' AND relname IN ('tasks', 'steps', 'step_events')`).Scan(&v.dead, &v.vacuums)
	return v, err
}

// sumCounter adds up the counters of a metric family.
func sumCounter(ms []*dto.Metric) float64 {
	var v float64
	for _, m := range ms {
		v += m.GetCounter().GetValue()
	}
	return v
}

// selfRSS is this process's resident set in kB (0 when /proc cannot be read).
func selfRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	kb, err := statusKB(b, "VmRSS")
	if err != nil {
		return 0
	}
	return kb
}
