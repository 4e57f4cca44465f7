package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// executeIsolated runs the command line with ctx and an empty environment (so that a DATABASE_URL of the
// machine cannot leak in), failing the test on a call to exit.
func executeIsolated(ctx context.Context, t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCommandWith(&globalOptions{
		stdout:    &out,
		stderr:    &errOut,
		lookupEnv: func(string) (string, bool) { return "", false },
		exit:      func(code int) { t.Errorf("exit(%d) called", code) },
	})
	root.SetArgs(args)
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// freeAddr returns a 127.0.0.1 address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// get fetches url without keeping connections (no goroutine outlives the test).
func get(t *testing.T, url string) (int, string, error) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestRunWorksStepsServesMetricsAndStopsOnCancel(t *testing.T) {
	t.Parallel()
	for _, dispatch := range []string{"direct", "river"} {
		t.Run(dispatch, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)

			var taskID int64
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, `{"name": "e2e", "steps": [
				{"name": "a", "handler": "noop"},
				{"name": "b", "handler": "fail", "input": {"times": 1}, "depends_on": ["a"],
				 "retry": {"backoff": "fixed", "base_delay_ms": 50}}]}`).Scan(&taskID))

			addr := freeAddr(t)
			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			type result struct {
				stdout, stderr string
				err            error
			}
			done := make(chan result, 1)
			go func() {
				stdout, stderr, err := executeIsolated(runCtx, t, "run", "--database-url", db.URL, "--dispatch", dispatch,
					"--metrics-addr", addr, "--poll-interval", "200ms", "--worker-id", "e2e-"+dispatch)
				done <- result{stdout, stderr, err}
			}()

			require.Eventually(t, func() bool {
				var status string
				err := db.Pool.QueryRow(ctx, "SELECT status FROM stepready.tasks WHERE id = $1", taskID).Scan(&status)
				return err == nil && status == "complete"
			}, time.Minute, 20*time.Millisecond, "the daemon runs the task, retry included")

			var worker string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT details ->> 'worker' FROM stepready.step_events
				WHERE task_id = $1 AND event = 'attempt.started' LIMIT 1`, taskID).Scan(&worker))
			require.Equal(t, "e2e-"+dispatch, worker, "--worker-id names the worker")

			code, body, err := get(t, "http://"+addr+"/healthz")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code, body)

			code, body, err = get(t, "http://"+addr+"/metrics")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, body, "stepready_attempts_started_total 3")
			require.Contains(t, body, `stepready_attempts_failed_total{class="transient"} 1`)
			require.Contains(t, body, "go_goroutines", "the process collectors are registered too")

			cancel()
			select {
			case r := <-done:
				require.NoError(t, r.err, r.stderr)
				require.Contains(t, r.stderr, "scheduler: stopped")
			case <-time.After(time.Minute):
				t.Fatal("run did not stop")
			}
			_, _, err = get(t, "http://"+addr+"/healthz")
			require.Error(t, err, "the health server is closed last")
		})
	}
}

func TestRunReportsABusyMetricsAddress(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()

	_, _, err = executeIsolated(context.Background(), t, "run", "--database-url", "postgres://x@127.0.0.1:1/x",
		"--metrics-addr", l.Addr().String())
	require.ErrorContains(t, err, fmt.Sprintf("--metrics-addr %s", l.Addr()))
	require.Equal(t, 1, exitCode(err))
}
