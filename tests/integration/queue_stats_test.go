package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// TestQueueStats: per queue, ready now, in flight, waiting for retry, due within a minute and the oldest ready
// step's wait, at a pinned p_as_of; finished steps are not read (the plan uses the partial indexes only).
func TestQueueStats(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	exec(`INSERT INTO stepready.tasks (name) VALUES ('t')`)
	// default: two ready (one since t0 - 10 s by its backoff), one due in 30 s, one due in 2 min, one in flight,
	// one complete; fast: one ready; a step blocked by a parent is not claimable and not counted.
	exec(`INSERT INTO stepready.steps (task_id, name, handler, queue, state, attempts, next_attempt_at) VALUES
		(1, 'r1', 'noop', 'default', 'pending', 0, NULL),
		(1, 'r2', 'noop', 'default', 'waiting_for_retry', 1, $1::timestamptz - interval '10 seconds'),
		(1, 'soon', 'noop', 'default', 'waiting_for_retry', 1, $1::timestamptz + interval '30 seconds'),
		(1, 'later', 'noop', 'default', 'waiting_for_retry', 1, $1::timestamptz + interval '2 minutes'),
		(1, 'fly', 'noop', 'default', 'in_progress', 1, NULL),
		(1, 'done', 'noop', 'default', 'complete', 1, NULL),
		(1, 'f1', 'noop', 'fast', 'pending', 0, NULL),
		(1, 'child', 'noop', 'fast', 'pending', 0, NULL)`, t0)
	exec(`INSERT INTO stepready.step_edges (parent_step_id, child_step_id) SELECT p.id, c.id
		FROM stepready.steps p, stepready.steps c WHERE p.name = 'fly' AND c.name = 'child'`)
	// r1 and f1 became ready when inserted: pin their updated_at so the lag is known.
	exec(`UPDATE stepready.steps SET updated_at = $1::timestamptz - interval '5 seconds' WHERE name IN ('r1', 'f1')`, t0)

	type row struct {
		Queue                             string
		Ready, InFlight, Waiting, DueSoon int64
		OldestAt                          *time.Time
		OldestSeconds                     *float64
		Estimated                         bool
	}
	rows, err := db.Pool.Query(ctx, `SELECT * FROM stepready.queue_stats($1)`, t0)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "default", got[0].Queue)
	require.Equal(t, []int64{2, 1, 2, 1}, []int64{got[0].Ready, got[0].InFlight, got[0].Waiting, got[0].DueSoon})
	require.NotNil(t, got[0].OldestSeconds)
	require.InDelta(t, 10.0, *got[0].OldestSeconds, 1e-6, "r2 has waited since its backoff ended, 10 s ago")
	require.Equal(t, "fast", got[1].Queue)
	require.Equal(t, []int64{1, 0, 0, 0}, []int64{got[1].Ready, got[1].InFlight, got[1].Waiting, got[1].DueSoon})
	require.InDelta(t, 5.0, *got[1].OldestSeconds, 1e-6)
	require.False(t, got[0].Estimated || got[1].Estimated, "a small backlog is counted exactly")

	// Finished steps are never read: the function reads steps only through the partial indexes, never by a
	// sequential scan (counted on a connection of its own).
	conn := db.Conn(t)
	scans := func() (seq, idx int64) {
		t.Helper()
		_, err := conn.Exec(ctx, `SELECT pg_catalog.pg_stat_force_next_flush()`)
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, `SELECT COALESCE(seq_scan, 0), COALESCE(idx_scan, 0)
			FROM pg_catalog.pg_stat_user_tables WHERE schemaname = 'stepready' AND relname = 'steps'`).Scan(&seq, &idx))
		return seq, idx
	}
	seq0, idx0 := scans()
	_, err = conn.Exec(ctx, `SELECT * FROM stepready.queue_stats($1)`, t0)
	require.NoError(t, err)
	seq1, idx1 := scans()
	require.Zero(t, seq1-seq0, "sequential scans of steps")
	require.Positive(t, idx1-idx0, "index scans of steps")
}

// A step an operator moved out of flight while its attempt ran keeps its slot until its lease expires (an orphaned
// lease, _holds_slot): queue_stats counts it in flight until then, as the flow limits do.
func TestQueueStatsCountsOrphanedLeases(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, stepID := b.oneStep(`"queue": "q"`)
	b.run(stepID, testBase)
	b.exec(`SELECT stepready.cancel_task($1, 'no', $2)`, taskID, testBase)
	b.requireState(stepID, "cancelled")
	inFlight := func(at time.Time) int64 {
		t.Helper()
		var n int64
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT COALESCE(sum(in_flight), 0)::bigint
			FROM stepready.queue_stats($1) WHERE queue = 'q'`, at).Scan(&n))
		return n
	}
	require.EqualValues(t, 1, inFlight(testBase), "the cancelled attempt may still run")
	require.EqualValues(t, 1, inFlight(testBase.Add(testLease)), "its lease ends at lease_expires_at")
	require.EqualValues(t, 0, inFlight(testBase.Add(testLease+tick)), "then its slot is free")
}

// Above _read_budget() claimable steps, queue_stats estimates the claimable figures from a sample and says so; it
// reads about twice the budget, not the backlog (an exact count read every claimable row: 250-330 ms with
// 1,000,000). The steps holding slots are still counted exactly.
func TestQueueStatsEstimatesAboveTheBudget(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	budget := b.intCall(`SELECT stepready._read_budget()`)
	const total = 50000 // a fifth of them in queue "fast", interleaved
	b.exec(`INSERT INTO stepready.tasks (name) VALUES ('t')`)
	b.exec(`INSERT INTO stepready.steps (task_id, name, handler, queue)
		SELECT 1, 's' || g, 'h', CASE WHEN g % 5 = 0 THEN 'fast' ELSE 'default' END FROM generate_series(1, $1) g`, total)
	b.exec(`UPDATE stepready.steps SET state = 'in_progress', attempts = 1, lease_owner = 'w', lease_expires_at = $1
		WHERE name IN ('s1', 's2', 's5')`, testBase.Add(time.Minute))
	b.exec(`VACUUM ANALYZE stepready.steps`)

	type row struct {
		Queue     string
		Ready     int64
		InFlight  int64
		Estimated bool
	}
	conn := b.db.Conn(t)
	before := stepsTuplesRead(t, conn)
	rows, err := conn.Query(b.ctx, `SELECT queue, ready, in_flight, estimated FROM stepready.queue_stats($1)`, testBase)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	read := stepsTuplesRead(t, conn) - before
	t.Logf("queue_stats over %d claimable steps: %+v, %d tuples of steps read", total-3, got, read)
	require.Len(t, got, 2)
	require.Equal(t, "default", got[0].Queue)
	require.Equal(t, "fast", got[1].Queue)
	require.True(t, got[0].Estimated && got[1].Estimated)
	require.InEpsilon(t, 0.8*total, got[0].Ready, 0.25, "default's ready steps, estimated")
	require.InEpsilon(t, 0.2*total, got[1].Ready, 0.25, "fast's ready steps, estimated")
	require.Equal(t, []int64{2, 1}, []int64{got[0].InFlight, got[1].InFlight}, "in flight: exact")
	require.LessOrEqual(t, read, int64(5*budget/2), "queue_stats read the backlog")
}
