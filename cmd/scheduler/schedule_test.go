package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestScheduleCommands(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	dir := t.TempDir()
	tmpl := writeFile(t, dir, "etl.yaml", etlTemplate+`schedules:
  - name: nightly
    cron: "30 2 * * *"
    timezone: Europe/Berlin
    context: {mode: full}
    overlap: skip
`)
	stdout, stderr, err := b.run("template", "apply", tmpl)
	require.NoError(t, err, stderr)
	require.Equal(t, "template etl version 1 created ("+tmpl+")\nschedule nightly created ("+tmpl+")\n", stdout)
	stdout, _, err = b.run("template", "apply", tmpl, "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `[{"name": "etl", "version": 1, "file": "`+tmpl+`", "created": false,
		"schedules": [{"name": "nightly", "created": false}]}]`, stdout)

	stdout, stderr, err = b.run("schedule", "create", "poll", "--template", "etl", "--cron", "@every 30s",
		"--context", `{"x": 1}`)
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, `schedule poll created: template etl, cron "@every 30s" (UTC), next fire `)

	require.Empty(t, stderr)
	_, stderr, err = b.run("schedule", "create", "ghost", "--template", "nope", "--cron", "@daily")
	require.NoError(t, err)
	require.Contains(t, stderr, "warning: template nope does not exist (yet)")
	_, _, err = b.run("schedule", "delete", "ghost")
	require.NoError(t, err)

	_, stderr, err = b.run("schedule", "create", "poll", "--template", "etl", "--cron", "@every 30s")
	require.ErrorContains(t, err, `schedule already exists: "poll"`, stderr)
	_, _, err = b.run("schedule", "create", "bad", "--template", "etl", "--cron", "61 * * * *")
	require.ErrorContains(t, err, `cron "61 * * * *"`)
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("schedule", "create", "bad", "--template", "etl", "--cron", "@daily", "--timezone", "Mars/Base")
	require.ErrorContains(t, err, `timezone "Mars/Base"`)
	_, _, err = b.run("schedule", "create", "bad", "--template", "etl", "--cron", "@daily", "--overlap", "queue")
	require.ErrorContains(t, err, `overlap: must be allow or skip`)

	stdout, _, err = b.run("schedule", "list", "-o", "json")
	require.NoError(t, err)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.Len(t, list, 2)
	require.Equal(t, "nightly", list[0]["name"])
	require.Equal(t, "skip", list[0]["overlap"])
	require.Equal(t, map[string]any{"mode": "full"}, list[0]["context"])
	stdout, _, err = b.run("schedule", "list")
	require.NoError(t, err)
	require.Contains(t, stdout, "NAME")
	require.Contains(t, stdout, "Europe/Berlin")

	stdout, _, err = b.run("schedule", "preview", "nightly", "-o", "json")
	require.NoError(t, err)
	var preview struct {
		FireTimes []time.Time `json:"fire_times"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &preview))
	require.Len(t, preview.FireTimes, 5)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	for _, ft := range preview.FireTimes {
		require.Equal(t, "02:30", ft.In(berlin).Format("15:04"))
	}
	stdout, _, err = b.run("schedule", "preview", "poll")
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(stdout), "\n"), 5)

	for _, op := range []string{"pause", "resume", "delete"} {
		stdout, _, err = b.run("schedule", op, "poll")
		require.NoError(t, err)
		require.Equal(t, "schedule poll "+op+"d\n", stdout)
	}
	_, _, err = b.run("schedule", "pause", "poll")
	require.ErrorContains(t, err, `schedule does not exist: "poll"`)
}

func TestTaskCreateRunAt(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	dir := t.TempDir()
	tmpl := writeFile(t, dir, "etl.yaml", etlTemplate)
	_, _, err := b.run("template", "apply", tmpl)
	require.NoError(t, err)

	stdout, stderr, err := b.run("task", "create", "etl", "--in", "1h", "-o", "json")
	require.NoError(t, err, stderr)
	var res struct {
		TaskID int64     `json:"task_id"`
		RunAt  time.Time `json:"run_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	require.Equal(t, int64(2), b.int64(`SELECT count(*) FROM stepready.steps
		WHERE task_id = $1 AND next_attempt_at = (SELECT run_at FROM stepready.tasks WHERE id = $1)`, res.TaskID),
		"both steps wait for run_at")
	stdout, _, err = b.run("task", "show", "1")
	require.NoError(t, err)
	require.Contains(t, stdout, "scheduled: starts at ")
	require.Contains(t, stdout, "(in 59m5")

	stdout, _, err = b.run("task", "create", "etl", "--run-at", "2031-01-01T00:00:00Z")
	require.NoError(t, err)
	require.Equal(t, "task 2 created from template etl (2 steps), scheduled to start at 2031-01-01T00:00:00Z\n", stdout)
	def := writeFile(t, dir, "task.yaml", "name: one\nsteps: [{name: a, handler: noop}]\n")
	stdout, _, err = b.run("task", "create", "-f", def, "--run-at", "2031-01-01T00:00:00+01:00")
	require.NoError(t, err)
	require.Equal(t, "task 3 created from "+def+" (1 step), scheduled to start at 2030-12-31T23:00:00Z\n", stdout)
	require.Equal(t, int64(1), b.int64(`SELECT count(*) FROM stepready.tasks WHERE id = 3
		AND run_at = '2030-12-31T23:00:00Z'`))
	// A run_at of the file is said too (issue 26: it was not), and --output id prints the id alone.
	later := writeFile(t, dir, "later.yaml", "name: later\nrun_at: 2031-06-01T02:00:00+02:00\nsteps: [{name: a, handler: noop}]\n")
	stdout, _, err = b.run("task", "create", "-f", later)
	require.NoError(t, err)
	require.Equal(t, "task 4 created from "+later+" (1 step), scheduled to start at 2031-06-01T00:00:00Z\n", stdout)
	stdout, _, err = b.run("task", "create", "-f", later, "-o", "id")
	require.NoError(t, err)
	require.Equal(t, "5\n", stdout)
	stdout, _, err = b.run("task", "create", "etl", "--idempotency-key", "k", "--output", "id")
	require.NoError(t, err)
	require.Equal(t, "6\n", stdout)
	stdout, _, err = b.run("task", "create", "etl", "--idempotency-key", "k", "--output", "id")
	require.NoError(t, err)
	require.Equal(t, "6\n", stdout, "the existing task's id")
	_, _, err = b.run("task", "list", "--output", "id")
	require.ErrorContains(t, err, `--output "id": want table or json`)
	_, _, err = b.run("task", "create", "etl", "--run-at", "tomorrow")
	require.ErrorContains(t, err, "--run-at")
	_, _, err = b.run("task", "create", "etl", "--run-at", "2031-01-01T00:00:00Z", "--in", "1h")
	require.ErrorContains(t, err, "not both")
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A schedule created with the CLI while the demo runs (`make run`) fires in the demo's daemon, and its tasks
// appear in the live account.
func TestDemoFiresASchedule(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	root := newRootCommandWith(&globalOptions{stdout: &out, stderr: &errOut,
		lookupEnv: func(string) (string, bool) { return "", false },
		exit:      func(code int) { t.Errorf("exit(%d) called", code) }})
	root.SetArgs([]string{"demo", "--database-url", db.URL})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			select {
			case err := <-done:
				t.Fatalf("demo ended while waiting for %s: %v\n%s\n%s", what, err, out.String(), errOut.String())
			default:
			}
			require.False(t, time.Now().After(deadline), "%s: not reached\n%s", what, out.String())
			<-time.After(50 * time.Millisecond)
		}
	}
	waitFor("the daemon keeps running", func() bool { return strings.Contains(out.String(), "The daemon keeps running") })
	require.Contains(t, out.String(), "scheduler schedule create")

	_, stderr, err := executeIsolated(context.Background(), t, "schedule", "create", "every-second",
		"--template", "diamond", "--cron", "@every 1s", "--database-url", db.URL)
	require.NoError(t, err, stderr)
	var id int64
	waitFor("a scheduled task completes", func() bool {
		err := db.Pool.QueryRow(context.Background(), `SELECT id FROM stepready.tasks
			WHERE idempotency_key LIKE 'schedule:every-second:%' AND status = 'complete' ORDER BY id LIMIT 1`).Scan(&id)
		return err == nil
	})
	waitFor("the account shows it", func() bool {
		return strings.Contains(out.String(), fmt.Sprintf("task diamond#%d complete", id))
	})
	cancel()
	require.NoError(t, <-done)
}
