package main

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(schedulerMainEnv) != "" {
		// Re-executed by a test as a real `scheduler` process (process_test.go): its arguments are the command
		// line.
		main()
		os.Exit(0)
	}
	os.Exit(pgtest.Main(m))
}

// execute runs the scheduler command line with args and returns what it wrote to stdout and stderr.
func execute(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCommand(&out, &errOut)
	root.SetArgs(args)
	err = root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func TestMigrateNeedsADatabase(t *testing.T) { // not parallel: it changes the environment
	t.Setenv("DATABASE_URL", "")
	t.Setenv("STEPREADY_DATABASE_URL", "")
	for _, sub := range []string{"up", "down", "status"} {
		_, _, err := execute(t, "migrate", sub)
		require.ErrorContains(t, err, "pass --database-url or set DATABASE_URL", sub)
		require.Equal(t, 2, exitCode(err), sub)
	}
}

func TestMigrateRejectsBadArguments(t *testing.T) {
	t.Parallel()
	_, _, err := execute(t, "migrate", "down", "--steps", "-1", "--database-url", "postgres://x@127.0.0.1:1/x")
	require.ErrorContains(t, err, "--steps -1")
	require.Equal(t, 2, exitCode(err))

	_, _, err = execute(t, "migrate", "force", "one", "--database-url", "postgres://x@127.0.0.1:1/x")
	require.ErrorContains(t, err, `VERSION "one"`)
	require.Equal(t, 2, exitCode(err))

	_, _, err = execute(t, "--log-level", "loud", "migrate", "up", "--database-url", "postgres://x@127.0.0.1:1/x")
	require.ErrorContains(t, err, "--log-level")
	require.Equal(t, 2, exitCode(err))
}

func TestMigrateUpStatusDown(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)

	stdout, _, err := execute(t, "migrate", "status", "--database-url", db.URL)
	require.NoError(t, err)
	require.Contains(t, stdout, "stepready schema: version 0 of ")
	require.Contains(t, stdout, "pending")

	_, stderr, err := execute(t, "migrate", "up", "--database-url", db.URL)
	require.NoError(t, err)
	require.Contains(t, stderr, "migrations: applied functions and triggers", "progress is logged to stderr")

	stdout, _, err = execute(t, "migrate", "status", "--database-url", db.URL)
	require.NoError(t, err)
	require.Contains(t, stdout, "up to date")

	_, _, err = execute(t, "migrate", "down", "--database-url", db.URL, "--log-level", "warn")
	require.NoError(t, err)

	stdout, _, err = execute(t, "migrate", "status", "--database-url", db.URL)
	require.NoError(t, err)
	require.Contains(t, stdout, "stepready schema: version 0 of ")
	require.Contains(t, stdout, "river schema:     version 0 of ")
}
