package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/readmodel"
)

// showFixture makes a diamond whose root failed once (transient, retry in 1 s) at cliBase, with every
// timestamp pinned so that table output is stable.
func showFixture(b *cliBundle) int64 {
	b.t.Helper()
	task := b.createTask(`{"name": "diamond", "steps": [
		{"name": "fetch", "handler": "http"},
		{"name": "parse", "handler": "noop", "depends_on": ["fetch"]},
		{"name": "meta", "handler": "noop", "depends_on": ["fetch"]},
		{"name": "load", "handler": "sql", "depends_on": ["parse", "meta"]}]}`)
	b.exec(`SELECT count(*) FROM stepready.claim_ready_steps(10, 'w1', 30000, $1)`, cliBase)
	b.exec(`SELECT stepready.start_step($1, 'w1', 30000, $2)`, b.stepID(task, "fetch"), cliBase)
	b.exec(`SELECT * FROM stepready.fail_step($1, 1, '{"class": "transient", "message": "connection reset"}', $2, 0)`,
		b.stepID(task, "fetch"), cliBase.Add(100*time.Millisecond))
	b.exec(`UPDATE stepready.tasks SET created_at = $2, updated_at = $2 WHERE id = $1`, task, cliBase.Add(-time.Minute))
	b.exec(`UPDATE stepready.step_events SET at = $2 WHERE task_id = $1 AND at > $3`, task, cliBase.Add(-time.Minute),
		cliBase.Add(time.Hour))
	return task
}

func TestTaskListShowEvents(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	showFixture(b)
	other := b.createTask(`{"name": "other", "steps": [{"name": "x", "handler": "noop"}]}`)
	b.exec(`UPDATE stepready.tasks SET created_at = $2, updated_at = $2 WHERE id = $1`, other, cliBase.Add(-2*time.Second))
	asOf := "--as-of=2030-01-01T12:00:00.3Z"

	stdout, stderr, err := b.run("task", "list", asOf)
	require.NoError(t, err, stderr)
	requireGolden(t, "task_list", stdout)

	stdout, _, err = b.run("task", "list", "--status", "in_progress", "-o", "json")
	require.NoError(t, err)
	var tasks []readmodel.TaskSummary
	require.NoError(t, json.Unmarshal([]byte(stdout), &tasks))
	require.Len(t, tasks, 1)
	require.Equal(t, "diamond", tasks[0].Name)
	stdout, _, err = b.run("task", "list", "--name", "other", "--limit", "1", "-o", "json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(stdout), &tasks))
	require.Len(t, tasks, 1)
	require.Equal(t, other, tasks[0].ID)
	stdout, _, err = b.run("task", "list", "--name", "nothing", "-o", "json")
	require.NoError(t, err)
	require.Equal(t, "[]\n", stdout)

	stdout, stderr, err = b.run("task", "show", "1", asOf)
	require.NoError(t, err, stderr)
	requireGolden(t, "task_show", stdout)
	require.Contains(t, stdout, "in 0.8s")
	require.Contains(t, stdout, "transient: connection reset")

	stdout, _, err = b.run("task", "show", "1", asOf, "-o", "json")
	require.NoError(t, err)
	requireGolden(t, "task_show_json", stdout)

	stdout, stderr, err = b.run("task", "events", "1")
	require.NoError(t, err, stderr)
	requireGolden(t, "task_events", stdout)
	stdout, _, err = b.run("task", "events", "1", "-o", "json")
	require.NoError(t, err)
	var events []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &events))
	require.NotEmpty(t, events)

	_, _, err = b.run("task", "show", "42")
	require.EqualError(t, err, "task 42 does not exist")
	require.Equal(t, 1, exitCode(err))
	_, _, err = b.run("task", "events", "42")
	require.EqualError(t, err, "task 42 does not exist")
	_, _, err = b.run("task", "list", "--status", "done")
	require.ErrorContains(t, err, `--status "done": want one of pending, in_progress, complete, error, cancelled`)
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("task", "list", "--limit", "0")
	require.Equal(t, 2, exitCode(err))
}

func TestShortDurationInDaysFromTwoDays(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		900 * time.Millisecond:           "0.9s",
		65 * time.Second:                 "1m05s",
		47*time.Hour + 59*time.Minute:    "47h59m",
		48 * time.Hour:                   "2d00h",
		27179*time.Hour + 28*time.Minute: "1132d11h",
	} {
		require.Equal(t, want, shortDuration(d), d)
	}
}
