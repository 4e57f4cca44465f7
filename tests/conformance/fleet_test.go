package conformance

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/python"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// TestMixedFleet is a fleet of two workers in two languages on one database (SPEC §21, issue 23 deliverable 5): a
// Go `scheduler run` with the built-in handlers only and the Python worker with the example handlers only
// (greet, countdown, busy_api: no built-in), working one DAG whose steps alternate between their handlers, in both
// dispatch modes of the Go daemon. Each claims only steps whose handler it has, so every step runs once, on the
// worker that has its handler, and none fails for want of a handler.
func TestMixedFleet(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	scheduler := buildScheduler(t, root)
	py, err := python.Find("psycopg")
	require.NoError(t, err, "the mixed fleet needs an interpreter that imports psycopg")
	for _, mode := range []string{"river", "direct"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			url := db.LoginRole(t, "stepready_worker")
			c := &caseEnv{t: t, db: db, pool: db.Pool}
			env := func(id string) map[string]string {
				return map[string]string{
					"STEPREADY_DATABASE_URL": url, "STEPREADY_WORKER_ID": id, "STEPREADY_LEASE": "5s",
					"STEPREADY_REAP_INTERVAL": "1s", "STEPREADY_POLL_INTERVAL": pollInterval,
					"STEPREADY_SHUTDOWN_GRACE": "100ms", "STEPREADY_CONCURRENCY": "4",
				}
			}
			goID, pyID := "fleet-go-"+mode, "fleet-python"
			pyEnv := env(pyID)
			pyEnv["PYTHONPATH"] = filepath.Join(root, "workers", "python") + ":" +
				filepath.Join(root, "workers", "python", "examples")
			pyEnv["PYTHONDONTWRITEBYTECODE"] = "1"

			// a (go) → b (python) → c (go) → d (python), and beside them e (python) → f (go) off a.
			steps := []any{
				map[string]any{"name": "a", "handler": "noop", "input": map[string]any{"n": 1}},
				map[string]any{"name": "b", "handler": "greet", "input": map[string]any{"name": "b"}, "depends_on": []string{"a"}},
				map[string]any{"name": "c", "handler": "noop", "input": map[string]any{"n": 3}, "depends_on": []string{"b"}},
				map[string]any{"name": "d", "handler": "greet", "input": map[string]any{"name": "d"}, "depends_on": []string{"c"}},
				map[string]any{"name": "e", "handler": "greet", "input": map[string]any{"name": "e"}, "depends_on": []string{"a"}},
				map[string]any{"name": "f", "handler": "noop", "input": map[string]any{"n": 6}, "depends_on": []string{"e"}},
			}
			want := map[string]string{"a": goID, "b": pyID, "c": goID, "d": pyID, "e": pyID, "f": goID}
			var tasks []int64
			for i := range 3 {
				tasks = append(tasks, c.createTask(map[string]any{"name": fmt.Sprintf("fleet-%d", i), "steps": steps}))
			}
			startWorker(t, workerSpec{name: "go-" + mode, argv: []string{scheduler, "run", "--dispatch", mode}},
				env(goID))
			startWorker(t, workerSpec{name: "python-examples", argv: []string{py, "-m", "stepready_worker",
				"--handlers", "greet"}}, pyEnv)

			for _, task := range tasks {
				for _, name := range []string{"d", "f"} {
					c.waitStep(task, name, wait, "complete", "error")
				}
				var status string
				require.NoError(t, c.pool.QueryRow(context.Background(),
					`SELECT status FROM stepready.tasks WHERE id = $1`, task).Scan(&status))
				require.Equal(t, "complete", status, "task %d", task)
				for name, worker := range want {
					s := c.step(task, name)
					require.Equal(t, "complete", s.State, "task %d step %s", task, name)
					require.Equal(t, 1, s.Attempts, "task %d step %s ran once", task, name)
					started := c.eventsNamed(s.ID, "attempt.started")
					require.Len(t, started, 1, "task %d step %s", task, name)
					require.Equal(t, worker, started[0].Details["worker"], "task %d step %s ran on the worker with its handler",
						task, name)
					require.Empty(t, c.eventsNamed(s.ID, "attempt.failed"), "task %d step %s", task, name)
				}
				require.JSONEq(t, `{"greeting": "hello, d"}`, string(c.step(task, "d").Output))
			}
		})
	}
}
