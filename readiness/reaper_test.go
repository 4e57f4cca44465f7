package readiness_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/readiness"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// While one instance holds the reaper's round, every other instance's round is a no-op: exactly one reaper.
func TestReaperElectsOneInstancePerRound(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// Two expired enqueued leases to reap.
	_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task('{"name": "t", "steps": [{"name": "a", "handler": "h"},
		{"name": "b", "handler": "h"}]}')`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT count(*) FROM stepready.claim_ready_steps(10, 'dead', 1, now() - interval '1 hour')`)
	require.NoError(t, err)

	r := &readiness.Reaper{Pool: db.Pool, Interval: time.Hour, Logger: slog.New(slog.DiscardHandler)}

	// Another instance is in the middle of its round: it holds the election lock.
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	var won bool
	require.NoError(t, holder.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, readiness.ReaperLockKey).Scan(&won))
	require.True(t, won)
	n, err := r.ReapOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the lock is taken: this instance does not reap")
	require.NoError(t, holder.Rollback(ctx))

	// Concurrent rounds: between them, the two steps are reaped exactly once.
	var wg sync.WaitGroup
	counts := make([]int, 4)
	for i := range counts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts[i], _ = r.ReapOnce(ctx)
		}()
	}
	wg.Wait()
	total := 0
	for _, c := range counts {
		total += c
	}
	require.Equal(t, 2, total)
	var expired int
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM stepready.step_events WHERE event = 'lease.expired'`).Scan(&expired)
	}))
	require.Equal(t, 2, expired)
}

// The elected reaper exports the backlog gauges of queue_stats per queue; an instance that loses the election
// exports none.
func TestReaperExportsTheBacklog(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task('{"name": "t", "steps": [{"name": "a", "handler": "h"},
		{"name": "b", "handler": "h", "queue": "fast"}, {"name": "c", "handler": "h", "depends_on": ["a"]}]}')`)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	r := &readiness.Reaper{Pool: db.Pool, Interval: time.Hour, Logger: slog.New(slog.DiscardHandler), Metrics: metrics.New(reg)}
	_, err = r.ReapOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1.0, testutil.ToFloat64(mustGauge(t, reg, "stepready_steps_ready", "default")))
	require.Equal(t, 1.0, testutil.ToFloat64(mustGauge(t, reg, "stepready_steps_ready", "fast")))

	// Another instance holds this round: this one is not elected and exports nothing.
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_try_advisory_xact_lock($1)`, readiness.ReaperLockKey)
	require.NoError(t, err)
	_, err = r.ReapOnce(ctx)
	require.NoError(t, err)
	n, err := testutil.GatherAndCount(reg, "stepready_steps_ready")
	require.NoError(t, err)
	require.Zero(t, n)
}

// The elected reaper exports what flow control holds back, by reason and without a label per key.
func TestReaperExportsFlowControl(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task('{"name": "t",
		"concurrency": {"key": "tenant:1", "limit": 1},
		"steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"}, {"name": "c", "handler": "h"}]}')`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT * FROM stepready.claim_ready_steps(10, 'w', 60000)`)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	r := &readiness.Reaper{Pool: db.Pool, Interval: time.Hour, Logger: slog.New(slog.DiscardHandler), Metrics: metrics.New(reg)}
	_, err = r.ReapOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2.0, testutil.ToFloat64(mustGaugeLabel(t, reg, "stepready_flow_blocked_steps", "reason", "concurrency_limited")))
	require.Equal(t, 1.0, testutil.ToFloat64(mustGaugeLabel(t, reg, "stepready_flow_blocked_keys", "reason", "concurrency_limited")))
	require.Equal(t, 0.0, testutil.ToFloat64(mustGaugeLabel(t, reg, "stepready_flow_blocked_steps", "reason", "rate_limited")))
}

// mustGauge returns the gauge name{queue=queue} of reg.
func mustGauge(t *testing.T, reg *prometheus.Registry, name, queue string) prometheus.Collector {
	t.Helper()
	return mustGaugeLabel(t, reg, name, "queue", queue)
}

// mustGaugeLabel returns the gauge name{label=value} of reg.
func mustGaugeLabel(t *testing.T, reg *prometheus.Registry, name, label, queue string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == queue {
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "copy"})
					g.Set(m.GetGauge().GetValue())
					return g
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, queue)
	return nil
}
