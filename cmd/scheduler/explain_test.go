package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/readmodel"
)

// explainFixture makes a task whose steps show each reason: fetch in flight at attempt 2/3, parse waiting for
// it, store in backoff for 1.8 s, once not retryable, flaky with its retries exhausted, and load ready.
func explainFixture(b *cliBundle) int64 {
	b.t.Helper()
	task := b.createTask(`{"name": "etl", "steps": [
		{"name": "fetch", "handler": "noop"},
		{"name": "parse", "handler": "noop", "depends_on": ["fetch"]},
		{"name": "store", "handler": "noop"},
		{"name": "once", "handler": "noop", "retry": {"policy": "none"}},
		{"name": "flaky", "handler": "noop"},
		{"name": "load", "handler": "noop"}]}`)
	b.exec(`UPDATE stepready.steps SET state = 'in_progress', attempts = 2 WHERE id = $1`, b.stepID(task, "fetch"))
	b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2 WHERE id = $1`,
		b.stepID(task, "store"), cliBase.Add(3*time.Second))
	b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 1 WHERE id = $1`, b.stepID(task, "once"))
	b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 3 WHERE id = $1`, b.stepID(task, "flaky"))
	return task
}

func TestExplainTaskTable(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	task := explainFixture(b)

	stdout, stderr, err := b.run("explain", "1", "--as-of", "2030-01-01T12:00:01.2Z")
	require.NoError(t, err, stderr)
	require.Equal(t, int64(1), task)
	requireGolden(t, "explain_task", stdout)
	require.Contains(t, stdout, "waiting for `fetch` (in_progress, attempt 2/3)")
	require.Contains(t, stdout, "backoff until 12:00:03 (in 1.8s)")
	require.Contains(t, stdout, "retries exhausted 3/3")
	require.Contains(t, stdout, "not retryable after first attempt")

	_, _, err = b.run("task", "pause", "1")
	require.NoError(t, err)
	stdout, stderr, err = b.run("explain", "--step", "1/parse", "--as-of", "2030-01-01T12:00:01.2Z")
	require.NoError(t, err, stderr)
	requireGolden(t, "explain_step_paused", stdout)
	require.Contains(t, stdout, "task paused")
}

func TestExplainJSON(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	explainFixture(b)

	stdout, stderr, err := b.run("explain", "1", "--as-of", "2030-01-01T12:00:01.2Z", "--output", "json")
	require.NoError(t, err, stderr)
	requireGolden(t, "explain_task_json", stdout)

	var report explainReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &report))
	require.Len(t, report.Steps, 6)
	byName := map[string]readmodel.ExplainedStep{}
	for _, s := range report.Steps {
		byName[s.Name] = s
	}
	require.Equal(t, "waiting_for_dependencies", byName["parse"].Reasons[0].Reason)
	require.Equal(t, "fetch", *byName["parse"].Reasons[0].ParentName)
	require.Equal(t, int64(1800), *byName["store"].Reasons[0].WaitMs)
	require.True(t, byName["load"].Ready)
	require.Len(t, byName["load"].Reasons, 1, "a ready step's one reason: the worker it waits for")
	require.Equal(t, "waiting_for_worker", byName["load"].Reasons[0].Reason)
	require.Contains(t, byName["load"].Reasons[0].Message, "queue default and has handler noop")

	// One step, judged at the database's own clock (no --as-of): store's backoff, in 2030, is another day.
	stdout, stderr, err = b.run("explain", "--step", "3", "-o", "json")
	require.NoError(t, err, stderr)
	var one explainReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &one))
	require.Len(t, one.Steps, 1)
	require.Equal(t, "backoff", one.Steps[0].Reasons[0].Reason)
	require.Contains(t, one.Steps[0].Reasons[0].Message, "backoff until 2030-01-01 12:00:03 (in ")
}

func TestExplainErrors(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)

	_, _, err := b.run("explain", "99")
	require.EqualError(t, err, "task 99 does not exist")
	require.Equal(t, 1, exitCode(err))

	_, _, err = b.run("explain", "--step", "99")
	require.EqualError(t, err, "step 99 does not exist")
	require.Equal(t, 1, exitCode(err))

	_, _, err = b.run("explain", "abc")
	require.ErrorContains(t, err, `TASK_ID "abc": want a positive integer id`)
	require.Equal(t, 2, exitCode(err))

	_, _, err = b.run("explain", "1", "--output", "yaml")
	require.ErrorContains(t, err, `--output "yaml": want table or json`)
	require.Equal(t, 2, exitCode(err))

	_, _, err = b.run("explain", "1", "--as-of", "noon")
	require.ErrorContains(t, err, `--as-of "noon"`)
	require.Equal(t, 2, exitCode(err))

	_, _, err = executeIsolated(t.Context(), t, "explain", "1")
	require.ErrorContains(t, err, "pass --database-url or set DATABASE_URL")
	require.Equal(t, 2, exitCode(err))
}
