package main

import (
	"encoding/json"
	"strconv"
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

// mapShowFixture makes a task whose map step "m" over five elements has fanned out at cliBase: element 0
// complete, element 1 failed once (waiting for retry), elements 2 and 3 started (in flight), element 4 pending.
func mapShowFixture(b *cliBundle) int64 {
	b.t.Helper()
	task := b.createTask(`{"name": "fan", "steps": [
		{"name": "m", "handler": "work", "input": {"x": "${element}"}, "map": {"over": [10, 20, 30, 40, 50]}},
		{"name": "join", "handler": "noop", "depends_on": ["m"]}]}`)
	b.exec(`SELECT count(*) FROM stepready.claim_ready_steps(10, 'w1', 30000, $1)`, cliBase) // fans out
	b.exec(`SELECT count(*) FROM stepready.claim_ready_steps(4, 'w1', 30000, $1)`, cliBase)
	for _, name := range []string{"m[0]", "m[1]", "m[2]", "m[3]"} {
		b.exec(`SELECT stepready.start_step($1, 'w1', 30000, $2)`, b.stepID(task, name), cliBase)
	}
	b.exec(`SELECT stepready.complete_step($1, 1, '{"y": "a long output of the first element, cut in the table"}', $2)`,
		b.stepID(task, "m[0]"), cliBase)
	b.exec(`SELECT * FROM stepready.fail_step($1, 1, '{"class": "transient", "message": "timeout"}', $2, 0)`,
		b.stepID(task, "m[1]"), cliBase.Add(100*time.Millisecond))
	b.exec(`UPDATE stepready.tasks SET created_at = $2, updated_at = $2 WHERE id = $1`, task, cliBase.Add(-time.Minute))
	return task
}

func TestTaskShowMapStep(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	task := mapShowFixture(b)
	id := strconv.FormatInt(task, 10)
	asOf := "--as-of=2030-01-01T12:00:00.3Z"

	// One row for the map step with its progress; no element rows.
	stdout, stderr, err := b.run("task", "show", id, asOf)
	require.NoError(t, err, stderr)
	requireGolden(t, "task_show_map", stdout)
	require.Contains(t, stdout, "1/5 complete, 2 in flight, 0 failed")
	require.NotContains(t, stdout, "m[0]")

	// --elements lists them under the map step, capped by --elements-limit.
	stdout, stderr, err = b.run("task", "show", id, asOf, "--elements", "--elements-limit", "3")
	require.NoError(t, err, stderr)
	requireGolden(t, "task_show_map_elements", stdout)
	require.Contains(t, stdout, "m[2]")
	require.NotContains(t, stdout, "m[3]")
	require.Contains(t, stdout, "… 2 more")

	// JSON: every element, structured, and the map step's counts.
	stdout, _, err = b.run("task", "show", id, asOf, "-o", "json")
	require.NoError(t, err)
	var d readmodel.TaskDetail
	require.NoError(t, json.Unmarshal([]byte(stdout), &d))
	var m *readmodel.Step
	var elements []readmodel.Step
	for i, s := range d.StepList {
		if s.Name == "m" {
			m = &d.StepList[i]
		}
		if s.IsElement() {
			elements = append(elements, s)
		}
	}
	require.NotNil(t, m)
	require.Equal(t, &readmodel.MapProgress{FannedOut: true, Total: 5, Done: 1, Failed: 0, InFlight: 2}, m.Map)
	require.Len(t, elements, 5)
	for i, e := range elements {
		require.Equal(t, m.ID, *e.MapStepID)
		require.Equal(t, int32(i), *e.ElementIndex)
	}
	require.JSONEq(t, `{"y": "a long output of the first element, cut in the table"}`, string(elements[0].Output))

	_, _, err = b.run("task", "show", id, "--elements-limit", "0")
	require.ErrorContains(t, err, "--elements-limit 0: must be 1 or more")
	require.Equal(t, 2, exitCode(err))
}
