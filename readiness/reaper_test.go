package readiness_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

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
