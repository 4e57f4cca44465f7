package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/pgcluster"
	"github.com/stepready/stepready/migrations"
)

// TestDatabaseCrashesLoseNothing (RELIABILITY #9): two daemon processes, one dispatching directly and one
// through River, work a few hundred tasks on a PostgreSQL of their own that is crash-restarted (immediate stop,
// as `pg_ctl restart -m immediate`) twice and then stopped for several seconds. Every task completes, no
// (step, attempt) is started twice, both daemons keep running through it and exit 0 at SIGTERM.
func TestDatabaseCrashesLoseNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, err := pgcluster.StartThrowaway(ctx, pgcluster.ThrowawayOptions{Settings: pgcluster.FastSettings})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Stop(context.Background()) })
	admin, err := pgxpool.New(ctx, cl.URL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE DATABASE crash`)
	admin.Close()
	require.NoError(t, err)
	url := cl.DatabaseURL("crash")
	require.NoError(t, migrations.Up(ctx, url, nil))

	const tasks = 300
	defs := make([]json.RawMessage, tasks)
	for i := range defs {
		defs[i] = json.RawMessage(`{"name": "crash", "steps": [{"name": "a", "handler": "work"},
			{"name": "b", "handler": "work", "depends_on": ["a"]}, {"name": "c", "handler": "work", "depends_on": ["b"]}]}`)
	}
	func() {
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		defer pool.Close()
		_, err = stepready.CreateTasks(ctx, pool, defs)
		require.NoError(t, err)
	}()

	daemons := map[string]*exec.Cmd{}
	for _, mode := range dispatchModes {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+url, childDispatchEnv+"="+mode)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
		daemons[mode] = cmd
	}
	exited := map[string]chan error{}
	for mode, cmd := range daemons {
		ch := make(chan error, 1)
		exited[mode] = ch
		go func() { ch <- cmd.Wait() }()
	}

	// completed counts complete tasks on a fresh connection (the server goes away between calls); -1 when the
	// server does not answer.
	completed := func() int {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := pgxpool.New(qctx, url)
		if err != nil {
			return -1
		}
		defer conn.Close()
		var n int
		if err := conn.QueryRow(qctx, `SELECT count(*) FROM stepready.tasks WHERE status = 'complete'`).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	waitFor := func(what string, atLeast int, limit time.Duration) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			if n := completed(); n >= atLeast {
				return
			}
			for mode, ch := range exited {
				select {
				case err := <-ch:
					t.Fatalf("the %s daemon exited during the outage: %v", mode, err)
				default:
				}
			}
			require.True(t, time.Now().Before(deadline), "%s: fewer than %d tasks complete after %s", what, atLeast, limit)
			<-time.After(50 * time.Millisecond)
		}
	}

	waitFor("before the first crash", tasks/10, time.Minute)
	require.NoError(t, cl.CrashStop())
	require.NoError(t, cl.Restart(ctx))
	n := completed()
	waitFor("after the first crash", n+tasks/10, time.Minute)
	require.NoError(t, cl.CrashStop())
	require.NoError(t, cl.Restart(ctx))
	n = completed()
	waitFor("after the second crash", n+tasks/10, time.Minute)
	// An outage of several seconds: longer than the daemons' lease (2 s), so leases expire while it lasts.
	require.NoError(t, cl.CrashStop())
	<-time.After(4 * time.Second)
	require.NoError(t, cl.Restart(ctx))
	waitFor("after the outage", tasks, 2*time.Minute)

	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	var twice []string
	rows, err := pool.Query(ctx, `SELECT format('step %s attempt %s started %s times', step_id, attempt, count(*))
		FROM stepready.step_events WHERE event = 'attempt.started' GROUP BY step_id, attempt HAVING count(*) > 1`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		twice = append(twice, s)
	}
	require.NoError(t, rows.Err())
	require.Empty(t, twice, "a (step, attempt) started twice")
	var steps int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE state = 'complete'`).Scan(&steps))
	require.Equal(t, 3*tasks, steps)

	for mode, cmd := range daemons {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-exited[mode]:
			require.NoError(t, err, "the %s daemon's exit", mode)
		case <-time.After(30 * time.Second):
			t.Fatalf("the %s daemon did not exit after SIGTERM", mode)
		}
		require.Equal(t, 0, cmd.ProcessState.ExitCode(), fmt.Sprintf("%s daemon", mode))
	}
}
