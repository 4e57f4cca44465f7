package readiness_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/readiness"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// The pruner deletes idle flow keys every round, in batches, on the elected instance only, and does so even
// when finished tasks are kept forever (flow_state is bookkeeping, not history).
func TestPrunerPrunesIdleFlowKeys(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	countKeys := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*)::int FROM stepready.flow_state`).Scan(&n))
		return n
	}
	_, err := db.Pool.Exec(ctx, `INSERT INTO stepready.flow_state (key) SELECT 'k' || g FROM generate_series(1, 5) g`)
	require.NoError(t, err)

	rounds := make(chan int, 10)
	p := &readiness.Pruner{Pool: db.Pool, Interval: time.Hour, RetentionComplete: -1, RetentionFailed: -1, Batch: 2,
		Logger: slog.New(slog.DiscardHandler), OnRound: func(n int) { rounds <- n }}

	// Another instance holds the pruner's lock: this one deletes nothing.
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	var won bool
	require.NoError(t, holder.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, readiness.PrunerLockKey).Scan(&won))
	require.True(t, won)
	n, err := p.PruneFlowKeys(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 5, countKeys())
	require.NoError(t, holder.Rollback(ctx))

	// Batches of 2 until one comes back short: all 5.
	n, err = p.PruneFlowKeys(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Zero(t, countKeys())

	// Run's first round, with both retentions negative, prunes the keys created since.
	_, err = db.Pool.Exec(ctx, `INSERT INTO stepready.flow_state (key) VALUES ('again')`)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	select {
	case tasks := <-rounds:
		require.Zero(t, tasks, "no task is pruned when tasks are kept forever")
	case <-time.After(30 * time.Second):
		t.Fatal("no pruner round within 30 s")
	}
	require.Zero(t, countKeys())
	cancel()
	require.NoError(t, <-done)
}
