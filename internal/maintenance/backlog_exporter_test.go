package maintenance_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/maintenance"
)

// The elected instance exports the backlog per queue and what flow control holds back by reason; an instance
// that loses the election exports none; a queue whose backlog ends reads 0 instead of vanishing.
func TestBacklogExporterExportsTheBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`SELECT stepready.create_task('{"name": "t", "steps": [{"name": "a", "handler": "h"},
		{"name": "b", "handler": "h", "queue": "fast"}, {"name": "c", "handler": "h", "depends_on": ["a"]}]}')`)
	b.exec(`SELECT stepready.create_task('{"name": "t", "concurrency": {"key": "tenant:1", "limit": 1},
		"steps": [{"name": "a", "handler": "h", "queue": "keyed"}, {"name": "b", "handler": "h", "queue": "keyed"},
		          {"name": "c", "handler": "h", "queue": "keyed"}]}')`)
	b.exec(`SELECT count(*) FROM stepready.claim_ready_steps(1, 'w', 60000)`) // one of the five ready
	e, err := maintenance.NewBacklogExporter(b.env, maintenance.BacklogExporterConfig{})
	require.NoError(t, err)

	won, err := e.RunOnce(b.ctx)
	require.NoError(t, err)
	require.True(t, won)
	gauge := func(name, label, value string) float64 {
		return testutil.ToFloat64(mustGauge(t, b, name, label, value))
	}
	sum := func(name string) float64 {
		return gauge(name, "queue", "default") + gauge(name, "queue", "fast") + gauge(name, "queue", "keyed")
	}
	require.Equal(t, 3.0, gauge("stepready_steps_ready", "queue", "keyed")+gauge("stepready_steps_in_flight", "queue", "keyed"))
	require.Equal(t, 4.0, sum("stepready_steps_ready"), "five ready steps, one claimed (c waits for a)")
	require.Equal(t, 1.0, sum("stepready_steps_in_flight"))
	require.Equal(t, 0.0, gauge("stepready_flow_blocked_steps", "reason", "rate_limited"))

	// Nothing left anywhere: every queue seen reads 0, and "default" is always there.
	b.exec(`TRUNCATE stepready.tasks CASCADE`)
	_, err = e.RunOnce(b.ctx)
	require.NoError(t, err)
	for _, q := range []string{"default", "fast", "keyed"} {
		require.Equal(t, 0.0, gauge("stepready_steps_ready", "queue", q), q)
		require.Equal(t, 0.0, gauge("stepready_oldest_ready_seconds", "queue", q), q)
	}
	require.Equal(t, 0.0, gauge("stepready_flow_blocked_keys", "reason", "concurrency_limited"))

	// Another instance holds this round: this one is not elected and exports nothing.
	b.holdLock(maintenance.LockBacklogExporter)
	won, err = e.RunOnce(b.ctx)
	require.NoError(t, err)
	require.False(t, won)
	n, err := testutil.GatherAndCount(b.reg, "stepready_steps_ready", "stepready_flow_blocked_steps")
	require.NoError(t, err)
	require.Zero(t, n)
}

// Flow control gauges count the keys at their limit and the steps they hold back, by reason only.
func TestBacklogExporterExportsFlowControl(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`SELECT stepready.create_task('{"name": "t", "concurrency": {"key": "tenant:1", "limit": 1},
		"steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"}, {"name": "c", "handler": "h"}]}')`)
	b.exec(`SELECT * FROM stepready.claim_ready_steps(10, 'w', 60000)`)
	e, err := maintenance.NewBacklogExporter(b.env, maintenance.BacklogExporterConfig{})
	require.NoError(t, err)
	_, err = e.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2.0, testutil.ToFloat64(mustGauge(t, b, "stepready_flow_blocked_steps", "reason", "concurrency_limited")))
	require.Equal(t, 1.0, testutil.ToFloat64(mustGauge(t, b, "stepready_flow_blocked_keys", "reason", "concurrency_limited")))
	require.Equal(t, 0.0, testutil.ToFloat64(mustGauge(t, b, "stepready_flow_blocked_steps", "reason", "rate_limited")))
}

// The map gauges: the map steps running and their elements by state (map_stats), 0 again once the map ends.
func TestBacklogExporterExportsMapProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`SELECT stepready.create_task('{"name": "t", "steps": [
		{"name": "m", "handler": "h", "map": {"over": [1, 2, 3, 4, 5]}}]}')`)
	b.exec(`SELECT count(*) FROM stepready.claim_and_start_steps(10, 'w', 60000)`) // fans out
	b.exec(`SELECT count(*) FROM stepready.claim_and_start_steps(3, 'w', 60000)`)
	b.exec(`SELECT stepready.complete_step(id, 1, '1') FROM stepready.steps WHERE element_index = 0`)
	e, err := maintenance.NewBacklogExporter(b.env, maintenance.BacklogExporterConfig{})
	require.NoError(t, err)
	_, err = e.RunOnce(b.ctx)
	require.NoError(t, err)
	elements := func(state string) float64 {
		return testutil.ToFloat64(mustGauge(t, b, "stepready_map_elements", "state", state))
	}
	require.Equal(t, 1.0, testutil.ToFloat64(mustGauge(t, b, "stepready_map_steps_running", "", "")))
	require.Equal(t, []float64{1, 0, 2, 2}, []float64{elements("done"), elements("failed"), elements("in_flight"),
		elements("other")})

	b.exec(`SELECT stepready.complete_step(id, 1, '1') FROM stepready.steps WHERE element_index IN (1, 2)`)
	b.exec(`SELECT count(*) FROM stepready.claim_and_start_steps(3, 'w', 60000)`)
	b.exec(`SELECT stepready.complete_step(id, 1, '1') FROM stepready.steps WHERE element_index IN (3, 4)`)
	_, err = e.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 0.0, testutil.ToFloat64(mustGauge(t, b, "stepready_map_steps_running", "", "")))
	require.Equal(t, 0.0, elements("done"))
}

// The gauges of waiting for the world (signal_stats): wait steps by reason, and the mailbox's signals received,
// delivered (consumed by a step) and buffered (sent before their step waits).
func TestBacklogExporterExportsWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`SELECT stepready.create_task('{"name": "t", "steps": [
		{"name": "a", "wait": {"signal": "go"}},
		{"name": "b", "wait": {"signal": "go"}},
		{"name": "nap", "wait": {"duration_ms": 3600000}},
		{"name": "first", "handler": "h"},
		{"name": "later", "depends_on": ["first"], "wait": {"signal": "later"}}]}')`)
	e, err := maintenance.NewBacklogExporter(b.env, maintenance.BacklogExporterConfig{})
	require.NoError(t, err)
	gauges := func() []float64 {
		_, err := e.RunOnce(b.ctx)
		require.NoError(t, err)
		return []float64{
			testutil.ToFloat64(mustGauge(t, b, "stepready_steps_waiting", "reason", "waiting_for_signal")),
			testutil.ToFloat64(mustGauge(t, b, "stepready_steps_waiting", "reason", "sleeping")),
			testutil.ToFloat64(mustGauge(t, b, "stepready_signals_received", "", "")),
			testutil.ToFloat64(mustGauge(t, b, "stepready_signals_delivered", "", "")),
			testutil.ToFloat64(mustGauge(t, b, "stepready_signals_buffered", "", "")),
		}
	}
	require.Equal(t, []float64{2, 1, 0, 0, 0}, gauges())

	b.exec(`SELECT stepready.send_signal(id, 'go') FROM stepready.tasks`)    // completes a
	b.exec(`SELECT stepready.send_signal(id, 'later') FROM stepready.tasks`) // buffered: later's parent runs
	require.Equal(t, []float64{1, 1, 2, 1, 1}, gauges())
}

// signal_stats reads its partial indexes, never the table of steps: with 20,000 finished steps beside a few
// waiting ones, a call scans steps sequentially zero times (pg_stat_xact_user_tables, in the call's transaction).
// It counted `state = 'waiting'` before, which no partial index answers once the signal index's predicate also
// holds `wait ? 'signal'`: a sequential scan of every step at every round of the exporter.
func TestSignalStatsReadsNoFinishedStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(`INSERT INTO stepready.tasks (name) SELECT 'done' FROM generate_series(1, 200)`)
	b.exec(`INSERT INTO stepready.steps (task_id, name, handler, state)
		SELECT t.id, 's' || g, 'noop', 'complete' FROM stepready.tasks t, generate_series(1, 100) g`)
	b.exec(`SELECT stepready.create_task('{"name": "t", "steps": [
		{"name": "a", "wait": {"signal": "go"}}, {"name": "nap", "wait": {"duration_ms": 3600000}}]}')`)
	b.exec(`ANALYZE stepready.steps`)
	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	var seq0, seq1 int64
	var forSignal, sleeping int64
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT COALESCE(sum(seq_scan), 0) FROM pg_stat_xact_user_tables
		WHERE schemaname = 'stepready' AND relname = 'steps'`).Scan(&seq0))
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT waiting_for_signal, sleeping FROM stepready.signal_stats()`).
		Scan(&forSignal, &sleeping))
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT COALESCE(sum(seq_scan), 0) FROM pg_stat_xact_user_tables
		WHERE schemaname = 'stepready' AND relname = 'steps'`).Scan(&seq1))
	require.Equal(t, []int64{1, 1}, []int64{forSignal, sleeping})
	require.Zero(t, seq1-seq0, "signal_stats scanned the steps table")
}
