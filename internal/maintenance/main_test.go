package maintenance_test

import (
	"context"
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/maintenance"
	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testBundle is one test's database and the environment the services run in.
type testBundle struct {
	t   *testing.T
	ctx context.Context
	db  *pgtest.DB
	reg *prometheus.Registry
	env maintenance.Env
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	db := pgtest.New(t)
	reg := prometheus.NewRegistry()
	return &testBundle{t: t, ctx: t.Context(), db: db, reg: reg,
		env: maintenance.Env{Pool: db.Pool, Metrics: metrics.New(reg)}}
}

func (b *testBundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, sql, args...)
	require.NoError(b.t, err)
}

func (b *testBundle) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// holdLock starts a transaction that holds the transaction advisory lock key, as another instance in the middle
// of its round does; the returned function ends it.
func (b *testBundle) holdLock(key int64) (release func()) {
	b.t.Helper()
	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(b.t, err)
	var won bool
	require.NoError(b.t, tx.QueryRow(b.ctx, `SELECT pg_try_advisory_xact_lock($1)`, key).Scan(&won))
	require.True(b.t, won)
	released := false
	release = func() {
		if !released {
			released = true
			require.NoError(b.t, tx.Rollback(context.WithoutCancel(b.ctx)))
		}
	}
	b.t.Cleanup(release)
	return release
}

// task creates a task of n steps of handler h in queue q; it returns its id.
func (b *testBundle) task(n int, queue string) int64 {
	b.t.Helper()
	var id int64
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.create_task(jsonb_build_object('name', 't',
		'steps', (SELECT jsonb_agg(jsonb_build_object('name', 's' || g, 'handler', 'h', 'queue', $2::text))
		            FROM generate_series(1, $1) g)))`, n, queue).Scan(&id))
	return id
}
