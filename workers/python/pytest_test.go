// Package python_test runs the Python worker's own tests (pytest, workers/python/tests) against a throwaway,
// migrated PostgreSQL of the Go test harness, so that `make test` (go test ./...) runs them too on a fresh
// machine with nothing to set up but Debian's python3-psycopg and python3-pytest.
package python_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/python"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestPytest runs `python3 -m pytest workers/python/tests` with a migrated database: STEPREADY_TEST_DATABASE_URL
// (its owner: fixtures, operator calls) and STEPREADY_TEST_WORKER_URL (a login role that is a member of
// stepready_worker only, which the worker under test connects as, so the tests also prove the role is enough).
func TestPytest(t *testing.T) {
	py, err := python.Find("psycopg", "pytest")
	require.NoError(t, err)
	db := pgtest.New(t)
	workerURL := db.LoginRole(t, "stepready_worker")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	cmd.Env = append(os.Environ(), "STEPREADY_TEST_DATABASE_URL="+db.URL, "STEPREADY_TEST_WORKER_URL="+workerURL,
		"PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s -m pytest:\n%s", py, out)
	require.NoError(t, err, "pytest failed (its output is above)")
}
