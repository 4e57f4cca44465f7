package pgtest_test

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// parallelNames collects the databases of the parallel subtests of TestParallelTestsGetTheirOwnDatabase.
var parallelNames sync.Map

func TestParallelTestsGetTheirOwnDatabase(t *testing.T) {
	t.Parallel()

	// The subtests run in parallel with each other; the parent's cleanup runs after all of them.
	t.Cleanup(func() {
		a, okA := parallelNames.Load("a")
		b, okB := parallelNames.Load("b")
		require.True(t, okA && okB, "both subtests ran")
		require.NotEqual(t, a, b)
	})

	for _, name := range []string{"a", "b"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)

			var current string
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT current_database()").Scan(&current))
			require.Equal(t, db.Name, current)
			parallelNames.Store(name, current)

			// A table made here is not seen by the other subtest: each starts from the template.
			_, err := db.Pool.Exec(ctx, "CREATE TABLE public.marker_"+name+" (id int)")
			require.NoError(t, err)
			var markers int
			require.NoError(t, db.Pool.QueryRow(ctx,
				"SELECT count(*) FROM pg_catalog.pg_tables WHERE tablename LIKE 'marker\\_%'").Scan(&markers))
			require.Equal(t, 1, markers)
		})
	}
}

func TestDatabaseIsMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	var exists bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'stepready')").Scan(&exists))
	require.True(t, exists, "schema stepready exists")

	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT EXISTS (SELECT FROM pg_catalog.pg_tables WHERE schemaname = 'public' AND tablename = 'river_job')").Scan(&exists))
	require.True(t, exists, "River's tables exist")
}

func TestSearchPathIsEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	check := func(t *testing.T, name string, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) {
		var searchPath string
		var currentSchema *string
		require.NoError(t, q.QueryRow(ctx, "SELECT pg_catalog.current_setting('search_path'), pg_catalog.current_schema()").
			Scan(&searchPath, &currentSchema), name)
		// Set in the startup packet the empty value reads back as ""; SET search_path = '' would show `""`.
		require.Contains(t, []string{"", `""`}, searchPath, name)
		require.Nil(t, currentSchema, "%s: no schema is current", name)

		// An unqualified name resolves nowhere (undefined_table).
		err := q.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(new(int64))
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, name)
		require.Equal(t, "42P01", pgErr.Code, name)
	}

	check(t, "Pool", db.Pool)
	check(t, "NewPool", db.NewPool(t, pgtest.MaxConns(1)))
	check(t, "Conn", db.Conn(t))
}

func TestNewPoolOptions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)

	pool := db.NewPool(t, pgtest.MaxConns(2))
	require.Equal(t, int32(2), pool.Config().MaxConns)
}

func TestNewEmptyIsNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmpty(t)

	var exists bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'stepready')").Scan(&exists))
	require.False(t, exists)
}
