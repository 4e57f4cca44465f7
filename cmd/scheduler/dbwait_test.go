package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/pgcluster"
	"github.com/stepready/stepready/migrations"
)

// unreachableURL is a database URL on a local port where nothing listens (it was free a moment ago).
func unreachableURL(t *testing.T) string {
	t.Helper()
	return "postgres://stepready@" + freeAddr(t) + "/stepready?sslmode=disable"
}

// healthz fetches url's /healthz: its status and body (0 when nothing answers).
func healthz(t *testing.T, base string) (int, string) {
	t.Helper()
	code, body, err := get(t, base+"/healthz")
	if err != nil {
		return 0, ""
	}
	return code, strings.TrimSpace(body)
}

// `scheduler run` and `scheduler ui` started while PostgreSQL is down wait for it (issue 27): their listeners
// are up, /healthz answers 503 "starting: waiting for the database", every failed try is logged with its error,
// and once the server is back (the same cluster restarted on its port) the daemon connects and works the task
// that waited, and both answer 200. Both then stop cleanly at SIGTERM. Before, both exited 1 at once.
func TestRunAndUIWaitForTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Default settings: with FastSettings (synchronous_commit off) the crash stop below could lose the task.
	cl, err := pgcluster.StartThrowaway(ctx, pgcluster.ThrowawayOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Stop(context.Background()) })
	admin, err := pgxpool.New(ctx, cl.URL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE DATABASE waiting`)
	admin.Close()
	require.NoError(t, err)
	url := cl.DatabaseURL("waiting")
	require.NoError(t, migrations.Up(ctx, url, nil))
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	var taskID int64
	err = pool.QueryRow(ctx, `SELECT stepready.create_task('{"name": "waited", "steps": [{"name": "a", "handler": "noop"}]}')`).
		Scan(&taskID)
	pool.Close()
	require.NoError(t, err)
	require.NoError(t, cl.CrashStop())

	metrics, console, ui := "http://"+freeAddr(t), "http://"+freeAddr(t), "http://"+freeAddr(t)
	run := startScheduler(t, nil, "run", "--database-url", url, "--metrics-addr", strings.TrimPrefix(metrics, "http://"),
		"--ui-addr", strings.TrimPrefix(console, "http://"), "--poll-interval", "200ms")
	uiProc := startScheduler(t, nil, "ui", "--database-url", url, "--addr", strings.TrimPrefix(ui, "http://"))
	for _, p := range []*schedulerProcess{run, uiProc} {
		waitFor(t, time.Minute, "two failed tries logged", func() bool {
			return strings.Count(p.stderr.String(), "database unreachable; trying again") >= 2
		})
		require.Contains(t, p.stderr.String(), "connect: connection refused", "each try is logged with its error")
	}
	for _, base := range []string{metrics, console, ui} {
		code, body := healthz(t, base)
		require.Equal(t, http.StatusServiceUnavailable, code, base)
		require.Equal(t, waitingForDatabase, body, base)
	}

	require.NoError(t, cl.Restart(ctx))
	pool, err = pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	waitFor(t, time.Minute, "the task that waited is complete", func() bool {
		var status string
		err := pool.QueryRow(ctx, `SELECT status FROM stepready.tasks WHERE id = $1`, taskID).Scan(&status)
		return err == nil && status == "complete"
	})
	for _, base := range []string{metrics, console, ui} {
		waitFor(t, time.Minute, base+"/healthz answers 200", func() bool {
			code, _ := healthz(t, base)
			return code == http.StatusOK
		})
	}
	code, body, err := get(t, ui+"/")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "waited", "the console shows the task")
	for _, p := range []*schedulerProcess{run, uiProc} {
		require.Contains(t, p.stderr.String(), "connected to the database")
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t, time.Minute))
	}
}

// --wait-for-db bounds the wait: past it, `run` and `ui` exit 1 with a message naming the flag, the time waited
// and the last error; 0 fails at the first try, without a retry.
func TestWaitForDBBoundsTheWait(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "ui"} {
		t.Run(cmd, func(t *testing.T) {
			t.Parallel()
			addr := []string{"--addr", "127.0.0.1:0"}
			if cmd == "run" {
				addr = nil
			}
			begin := time.Now()
			_, stderr, err := executeIsolated(context.Background(), t, append([]string{cmd, "--database-url", unreachableURL(t),
				"--wait-for-db", "1s"}, addr...)...)
			require.ErrorContains(t, err, "connect to the database: still unreachable after")
			require.ErrorContains(t, err, "(--wait-for-db 1s)")
			require.ErrorContains(t, err, "connection refused")
			require.Equal(t, 1, exitCode(err))
			require.GreaterOrEqual(t, time.Since(begin), time.Second)
			require.GreaterOrEqual(t, strings.Count(stderr, "database unreachable; trying again"), 2, stderr)

			begin = time.Now()
			_, stderr, err = executeIsolated(context.Background(), t, append([]string{cmd, "--database-url", unreachableURL(t),
				"--wait-for-db", "0"}, addr...)...)
			require.ErrorContains(t, err, "connect to the database: ")
			require.NotContains(t, err.Error(), "still unreachable")
			require.Equal(t, 1, exitCode(err))
			require.NotContains(t, stderr, "trying again")
			require.Less(t, time.Since(begin), dbTryTimeout)
		})
	}
}

// SIGTERM while `run` or `ui` waits for the database ends it at once with status 0.
func TestSIGTERMWhileWaitingForTheDatabaseExitsCleanly(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "ui"} {
		t.Run(cmd, func(t *testing.T) {
			t.Parallel()
			p := startScheduler(t, nil, cmd, "--database-url", unreachableURL(t), "--addr", "127.0.0.1:0")
			if cmd == "run" {
				p = startScheduler(t, nil, cmd, "--database-url", unreachableURL(t))
			}
			waitFor(t, time.Minute, "a failed try logged", func() bool {
				return strings.Contains(p.stderr.String(), "database unreachable; trying again")
			})
			p.signal(t, syscall.SIGTERM)
			require.Equal(t, 0, p.wait(t, 10*time.Second))
			require.Contains(t, p.stderr.String(), "stopped while waiting for the database")
		})
	}
}
