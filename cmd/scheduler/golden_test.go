package main

import (
	"context"
	"flag"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// update rewrites the golden files: go test ./cmd/scheduler -run TestName -update
var update = flag.Bool("update", false, "rewrite testdata/*.golden with the output the tests produce")

// requireGolden compares got with testdata/name.golden (or writes it with -update).
func requireGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run the test with -update to create %s", path)
	require.Equal(t, string(want), got, "%s differs (run with -update to accept the new output)", path)
}

// cliBase is the pinned time of the command-line tests (passed as --as-of and p_as_of).
var cliBase = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// cliBundle is a migrated database for the command-line tests, with a URL that pins the session time zone to
// UTC so that clock times in the output do not depend on the server's configuration.
type cliBundle struct {
	t    *testing.T
	db   *pgtest.DB
	url  string
	pool *pgxpool.Pool
}

func cliSetup(t *testing.T) *cliBundle {
	t.Helper()
	db := pgtest.New(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("timezone", "UTC")
	u.RawQuery = q.Encode()
	return &cliBundle{t: t, db: db, url: u.String(), pool: db.Pool}
}

// run runs the scheduler with args plus --database-url, in an empty environment.
func (b *cliBundle) run(args ...string) (stdout, stderr string, err error) {
	b.t.Helper()
	return executeIsolated(context.Background(), b.t, append(args, "--database-url", b.url)...)
}

// exec runs one statement.
func (b *cliBundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(b.t, err, sql)
}

// int64 runs a query returning one integer.
func (b *cliBundle) int64(sql string, args ...any) int64 {
	b.t.Helper()
	var v int64
	require.NoError(b.t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&v), sql)
	return v
}

// createTask creates a task from a JSON definition.
func (b *cliBundle) createTask(definition string) int64 {
	b.t.Helper()
	return b.int64(`SELECT stepready.create_task($1::jsonb)`, definition)
}

// stepID returns the id of the step called name in task.
func (b *cliBundle) stepID(task int64, name string) int64 {
	b.t.Helper()
	return b.int64(`SELECT id FROM stepready.steps WHERE task_id = $1 AND name = $2`, task, name)
}
