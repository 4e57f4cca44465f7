package pgcluster

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTimeout bounds one test's database work (initdb and server starts included).
const testTimeout = 3 * time.Minute

type testBundle struct {
	ctx    context.Context
	logger *slog.Logger
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	if _, err := newestBinDir(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no local PostgreSQL in CI (.ci/run installs it): %v", err)
		}
		t.Skipf("no local PostgreSQL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return &testBundle{ctx: ctx, logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
}

// reachableDir returns a new directory that the server user may enter (t.TempDir is mode 0700, which keeps the
// postgres user out when the tests run as root); it is removed, and any server left on it stopped, at cleanup.
func reachableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "stepready-pgcluster-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() {
		forceStop(t, filepath.Join(dir, "data"))
		require.NoError(t, os.RemoveAll(dir))
	})
	return dir
}

// forceStop stops a server still running on dataDir after a failed test (immediate shutdown).
func forceStop(t *testing.T, dataDir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dataDir, "postmaster.pid")); err != nil {
		return
	}
	bin, err := newestBinDir()
	require.NoError(t, err)
	cred, err := serverCredential()
	require.NoError(t, err)
	_ = runAs(context.Background(), cred, "/", bin.path("pg_ctl"), "stop", "--pgdata", dataDir, "--mode", "immediate", "--wait")
}

// query runs a one-value query on the database at url in a connection of its own.
func query[T any](t *testing.T, ctx context.Context, url, sql string) T {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { require.NoError(t, conn.Close(ctx)) }()
	var v T
	require.NoError(t, conn.QueryRow(ctx, sql).Scan(&v))
	return v
}

// serverUID returns the user id of the server process of dataDir.
func serverUID(t *testing.T, dataDir string) int {
	t.Helper()
	pid, err := readPid(filepath.Join(dataDir, "postmaster.pid"))
	require.NoError(t, err)
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			uid, err := strconv.Atoi(strings.Fields(rest)[0])
			require.NoError(t, err)
			return uid
		}
	}
	t.Fatal("no Uid line in /proc/PID/status")
	return -1
}

func requireNotRoot(t *testing.T, dataDir string) {
	t.Helper()
	if os.Geteuid() == 0 {
		require.NotZero(t, serverUID(t, dataDir), "as root, the server runs as an unprivileged user")
	}
}

func TestThrowaway(t *testing.T) {
	t.Parallel()
	b := setup(t)

	c, err := StartThrowaway(b.ctx, ThrowawayOptions{Settings: FastSettings, Logger: b.logger})
	require.NoError(t, err)
	require.True(t, c.Started)
	require.True(t, strings.HasPrefix(c.URL, "postgres://postgres@127.0.0.1:"), c.URL)
	require.True(t, strings.HasSuffix(c.URL, "/postgres?sslmode=disable"), c.URL)
	requireNotRoot(t, c.DataDir)

	require.Equal(t, "off", query[string](t, b.ctx, c.URL, "SHOW fsync"), "the settings are applied")
	require.Equal(t, c.DataDir, query[string](t, b.ctx, c.URL, "SHOW unix_socket_directories"))

	require.NoError(t, c.Stop(b.ctx))
	require.NoError(t, c.Stop(b.ctx), "Stop is idempotent")
	_, err = os.Stat(c.Dir)
	require.ErrorIs(t, err, fs.ErrNotExist, "the directory is removed")
}

func TestPersistentReusesDataAcrossRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := reachableDir(t)

	// Run 1: initdb, start, create the database stepready; a table made now must survive.
	c1, err := StartPersistent(b.ctx, dir, b.logger)
	require.NoError(t, err)
	require.True(t, c1.Started)
	require.Equal(t, filepath.Join(dir, "data"), c1.DataDir)
	require.Equal(t, c1.DatabaseURL(DatabaseName), c1.URL)
	requireNotRoot(t, c1.DataDir)
	require.Equal(t, "stepready", query[string](t, b.ctx, c1.URL, "SELECT current_database()"))
	conn, err := pgx.Connect(b.ctx, c1.URL)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, "CREATE TABLE public.kept AS SELECT 1 AS id")
	require.NoError(t, err)
	require.NoError(t, conn.Close(b.ctx))

	require.NoError(t, c1.Stop(b.ctx))
	_, err = os.Stat(filepath.Join(c1.DataDir, "postmaster.pid"))
	require.ErrorIs(t, err, fs.ErrNotExist, "the server is stopped")

	// Run 2: the stopped server is started again on the same data.
	c2, err := StartPersistent(b.ctx, dir, b.logger)
	require.NoError(t, err)
	require.True(t, c2.Started)
	require.Equal(t, c1.DataDir, c2.DataDir)
	requireNotRoot(t, c2.DataDir)
	require.Equal(t, int64(1), query[int64](t, b.ctx, c2.URL, "SELECT count(*) FROM public.kept"),
		"the table of run 1 is still there")

	st, err := readState(dir)
	require.NoError(t, err)
	require.Equal(t, state{DataDir: c2.DataDir, Port: c2.Port}, st, "cluster.json records the port")

	// Run 3 while run 2's server is up: it is reused, not started again.
	c3, err := StartPersistent(b.ctx, dir, b.logger)
	require.NoError(t, err)
	require.False(t, c3.Started)
	require.Equal(t, c2.Port, c3.Port)
	require.Equal(t, c2.URL, c3.URL)

	// Stop leaves a server that someone else is still connected to running...
	conn, err = pgx.Connect(b.ctx, c2.URL)
	require.NoError(t, err)
	require.NoError(t, c3.Stop(b.ctx))
	require.NoError(t, conn.Ping(b.ctx), "the other client keeps its server")
	require.NoError(t, conn.Close(b.ctx))

	// ...and stops it once nobody is.
	require.NoError(t, c2.Stop(b.ctx))
	_, err = os.Stat(filepath.Join(c2.DataDir, "postmaster.pid"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func TestPersistentFallsBackWhenTheServerUserCannotEnter(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		// CI runs as root, so this test runs there; only a developer's own account skips it.
		t.Skip("only root hands the server to another user")
	}
	b := setup(t)
	dir := t.TempDir() // mode 0700, owned by root: the postgres user cannot enter it

	c, err := StartPersistent(b.ctx, dir, b.logger)
	require.NoError(t, err)
	base := filepath.Dir(c.DataDir)
	t.Cleanup(func() {
		forceStop(t, c.DataDir)
		require.NoError(t, os.RemoveAll(base))
	})
	require.True(t, strings.HasPrefix(filepath.Base(base), fallbackPrefix), c.DataDir)
	requireNotRoot(t, c.DataDir)

	st, err := readState(dir)
	require.NoError(t, err)
	require.Equal(t, c.DataDir, st.DataDir, "cluster.json in the directory points at the data")
	require.NoError(t, c.Stop(b.ctx))

	again, err := StartPersistent(b.ctx, dir, b.logger)
	require.NoError(t, err)
	require.Equal(t, c.DataDir, again.DataDir)
	require.NoError(t, again.Stop(b.ctx))
}

func TestFallbackBaseRefusesAForeignDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base, err := fallbackBase(dir)
	require.NoError(t, err)
	require.NoError(t, os.Remove(base))

	// A symlink planted under the predictable name is refused.
	require.NoError(t, os.Symlink(t.TempDir(), base))
	t.Cleanup(func() { _ = os.Remove(base) })
	_, err = fallbackBase(dir)
	require.Error(t, err)
	require.False(t, errors.Is(err, fs.ErrNotExist))
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	require.Equal(t, `'/a b/it'\''s'`, shellQuote("/a b/it's"))
}
