package migrations_test

import (
	"context"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/migrations"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// relationExists reports whether the schema-qualified relation exists.
func relationExists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var exists bool
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT pg_catalog.to_regclass($1) IS NOT NULL", name).Scan(&exists))
	return exists
}

// schemaExists reports whether the stepready schema exists.
func schemaExists(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var exists bool
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'stepready')").Scan(&exists))
	return exists
}

func TestStatusOfANeverMigratedDatabaseCreatesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmpty(t)

	state, err := migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.Zero(t, state.Version)
	require.False(t, state.Dirty)
	require.Zero(t, state.RiverVersion)
	require.Positive(t, state.Latest)
	require.Positive(t, state.RiverLatest)
	require.False(t, state.UpToDate())

	require.False(t, relationExists(t, db.Pool, "public."+migrations.MigrationsTable))
	require.False(t, relationExists(t, db.Pool, "public.river_migration"))
}

func TestConcurrentUpFromSeveralMigrators(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewEmpty(t)

	const migrators = 4
	errs := make([]error, migrators)
	var wg sync.WaitGroup
	for i := range migrators {
		wg.Go(func() { errs[i] = migrations.Up(ctx, db.URL, nil) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "migrator %d", i)
	}

	state, err := migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.True(t, state.UpToDate(), "%+v", state)
	require.True(t, schemaExists(t, db.Pool))
	require.True(t, relationExists(t, db.Pool, "public.river_job"))

	// Once more changes nothing and fails nothing: functions are simply re-applied.
	require.NoError(t, migrations.Up(ctx, db.URL, nil))
}

func TestDownToZeroThenUpAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	require.NoError(t, migrations.Down(ctx, db.URL, nil, 0))

	state, err := migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.Zero(t, state.Version)
	require.Zero(t, state.RiverVersion)
	require.False(t, schemaExists(t, db.Pool))
	require.False(t, relationExists(t, db.Pool, "public.river_job"))
	require.False(t, relationExists(t, db.Pool, "public.river_migration"))

	// Down on an empty database is not an error either.
	require.NoError(t, migrations.Down(ctx, db.URL, nil, 0))

	require.NoError(t, migrations.Up(ctx, db.URL, nil))
	state, err = migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.True(t, state.UpToDate(), "%+v", state)
	require.True(t, schemaExists(t, db.Pool))

	// The seed rows are back, exactly once, and the functions work again.
	var presets, classes int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM stepready.retry_policies),
		(SELECT count(*) FROM stepready.failure_classes)`).Scan(&presets, &classes))
	require.Equal(t, 4, presets)
	require.Equal(t, 10, classes)
	var eligible bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.retry_eligible(0, 0, false)`).Scan(&eligible))
	require.True(t, eligible)
}

func TestDownBySteps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	before, err := migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.True(t, before.UpToDate(), "%+v", before)

	require.NoError(t, migrations.Down(ctx, db.URL, nil, 1))
	after, err := migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.Equal(t, previousVersion(t, before.Latest), after.Version)
	require.Equal(t, before.RiverVersion, after.RiverVersion, "a one-version rollback keeps River's tables")

	// More steps than versions goes to zero without failing, River's tables with it.
	require.NoError(t, migrations.Down(ctx, db.URL, nil, int(before.Latest)+5))
	after, err = migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.Zero(t, after.Version)
	require.Zero(t, after.RiverVersion, "River's tables go with the last stepready version")
}

func TestDirtyVersionBlocksUpUntilForced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	_, err := db.Pool.Exec(ctx, "UPDATE public."+migrations.MigrationsTable+" SET dirty = true")
	require.NoError(t, err)

	state, err := migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.True(t, state.Dirty)
	require.False(t, state.UpToDate())

	err = migrations.Up(ctx, db.URL, nil)
	require.ErrorContains(t, err, "dirty")
	require.ErrorContains(t, err, "stepready schema")

	require.NoError(t, migrations.Force(ctx, db.URL, nil, int(state.Version)))
	require.NoError(t, migrations.Up(ctx, db.URL, nil))
	state, err = migrations.Status(ctx, db.URL)
	require.NoError(t, err)
	require.True(t, state.UpToDate(), "%+v", state)

	require.ErrorContains(t, migrations.Force(ctx, db.URL, nil, -2), "must be -1 or more")
}

func TestUnreachableDatabaseFailsClearly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := "postgres://nobody@127.0.0.1:1/nothing?sslmode=disable&connect_timeout=2"

	err := migrations.Up(ctx, url, nil)
	require.ErrorContains(t, err, "migrations: up: stepready schema: connect")

	_, err = migrations.Status(ctx, url)
	require.ErrorContains(t, err, "migrations: status: connect")

	err = migrations.Up(ctx, "not a url at all", nil)
	require.ErrorContains(t, err, "parse database URL")
}

// previousVersion is the highest embedded version below latest (versions need not be consecutive: branches
// take their own numbers).
func previousVersion(t *testing.T, latest uint) uint {
	t.Helper()
	entries, err := fs.ReadDir(migrations.FS, ".")
	require.NoError(t, err)
	var prev uint
	for _, e := range entries {
		digits, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.ParseUint(digits, 10, 64)
		if ok && err == nil && uint(v) < latest && uint(v) > prev {
			prev = uint(v)
		}
	}
	return prev
}

// Check names what is wrong with the database's schema, as the daemon and the commands show it.
func TestCheckComparesTheSchemaWithTheBinary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	empty := pgtest.NewEmpty(t)
	require.ErrorIs(t, migrations.Check(ctx, empty.Pool), migrations.ErrNotMigrated)

	db := pgtest.New(t)
	require.NoError(t, migrations.Check(ctx, db.Pool))
	table := "public." + migrations.MigrationsTable
	for _, tc := range []struct {
		sql  string
		kind error
		want string
	}{
		{`UPDATE ` + table + ` SET version = version - 1`, migrations.ErrSchemaOlder, "is older than this binary"},
		{`UPDATE ` + table + ` SET version = version + 1`, migrations.ErrSchemaNewer, "is newer than this binary"},
		{`UPDATE ` + table + ` SET dirty = true`, migrations.ErrSchemaDirty, "is dirty"},
		{`COMMENT ON SCHEMA stepready IS NULL`, migrations.ErrSchemaOlder, "functions of another build"},
	} {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, tc.sql)
		require.NoError(t, err)
		err = migrations.Check(ctx, tx)
		require.ErrorIs(t, err, tc.kind, tc.sql)
		require.ErrorContains(t, err, tc.want)
		require.NoError(t, tx.Rollback(ctx))
	}
}
