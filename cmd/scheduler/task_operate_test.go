package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOperatorCommandsPrintWhatChanged(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	task := b.createTask(`{"name": "ops", "steps": [
		{"name": "charge", "handler": "noop"},
		{"name": "ship", "handler": "noop", "depends_on": ["charge"]}]}`)
	charge, ship := b.stepID(task, "charge"), b.stepID(task, "ship")
	b.exec(`UPDATE stepready.steps SET state = 'error', attempts = 3, max_attempts = 3 WHERE id = $1`, charge)

	var transcript strings.Builder
	step := func(args ...string) {
		t.Helper()
		stdout, stderr, err := b.run(args...)
		require.NoError(t, err, "%v: %s", args, stderr)
		transcript.WriteString("$ scheduler " + strings.Join(args, " ") + "\n" + stdout)
	}
	step("step", "retry", "1")
	step("task", "pause", "1")
	step("task", "pause", "1")
	step("task", "resume", "1")
	step("task", "resume", "1")
	step("task", "cancel", "1", "--reason", "wrong input")
	step("task", "reset", "1")
	step("step", "resolve", "2", "--output", `{"tracking": "none"}`)
	requireGolden(t, "operate", transcript.String())
	_ = ship
	// Every operator event of the CLI says who acted.
	require.Zero(t, b.int64(`SELECT count(*) FROM stepready.step_events WHERE event LIKE 'operator.%'
		AND details ->> 'actor' IS DISTINCT FROM 'cli'`))
	require.Positive(t, b.int64(`SELECT count(*) FROM stepready.step_events WHERE details ->> 'actor' = 'cli'`))

	// Refusals: the database's message, exit status 1.
	_, _, err := b.run("step", "resolve", "2", "--output", `{}`)
	require.EqualError(t, err, `cannot resolve step 2 ("ship"): it is already resolved_manually`)
	require.Equal(t, 1, exitCode(err))

	b.exec(`UPDATE stepready.steps SET state = 'complete', attempts = 1 WHERE id = $1`, charge)
	_, _, err = b.run("task", "cancel", "1")
	require.EqualError(t, err, "cannot cancel task 1: it is already complete")
	require.Equal(t, 1, exitCode(err))
	_, _, err = b.run("task", "pause", "1")
	require.EqualError(t, err, "cannot pause task 1: it is complete")
	_, _, err = b.run("task", "reset", "1")
	require.EqualError(t, err, "cannot reset task 1 (complete): it has no error, skipped or cancelled step")
	_, _, err = b.run("step", "retry", "1")
	require.EqualError(t, err, `cannot retry step 1 ("charge"): it is complete`)
	require.Equal(t, 1, exitCode(err))

	_, _, err = b.run("step", "retry", "99")
	require.EqualError(t, err, "step 99 does not exist")
	require.Equal(t, 1, exitCode(err))
	_, _, err = b.run("task", "resume", "99")
	require.EqualError(t, err, "task 99 does not exist")
	require.Equal(t, 1, exitCode(err))

	// Usage errors: exit status 2.
	_, _, err = b.run("step", "resolve", "2")
	require.ErrorContains(t, err, "--output: a JSON document (or @FILE) is required")
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("step", "resolve", "2", "--output", "{nope")
	require.ErrorContains(t, err, "--output: not valid JSON")
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("task", "cancel", "x")
	require.ErrorContains(t, err, `TASK_ID "x"`)
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("task", "cancel")
	require.Equal(t, 2, exitCode(err))

	// One step is 1 step.
	one := b.createTask(`{"name": "one", "steps": [{"name": "a", "handler": "noop"}]}`)
	stdout, stderr, err := b.run("task", "cancel", strconv.FormatInt(one, 10))
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, fmt.Sprintf("task %d cancelled: 1 step cancelled\n", one))
	stdout, stderr, err = b.run("task", "reset", strconv.FormatInt(one, 10))
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, fmt.Sprintf("task %d reset: 1 step back to pending\n", one))
}

func TestOperatorCommandsJSON(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	task := b.createTask(`{"name": "ops", "steps": [{"name": "a", "handler": "noop"}, {"name": "b", "handler": "noop"}]}`)
	a := b.stepID(task, "a")
	b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2 WHERE id = $1`,
		a, cliBase)

	stdout, stderr, err := b.run("step", "retry", "1/a", "-o", "json")
	require.NoError(t, err, stderr)
	var sc map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &sc))
	require.Equal(t, "retry", sc["action"])
	require.Equal(t, "waiting_for_retry", sc["previous_state"])
	require.Equal(t, "waiting_for_retry", sc["state"])
	require.Equal(t, "2030-01-01T12:00:00Z", sc["previous_next_attempt_at"])
	require.Nil(t, sc["next_attempt_at"])
	require.Equal(t, "pending", sc["task_status"])

	stdout, stderr, err = b.run("task", "cancel", "1", "--output", "json")
	require.NoError(t, err, stderr)
	requireGolden(t, "task_cancel_json", stdout)

	stdout, stderr, err = b.run("step", "resolve", "2", "--output", `{"n": 1}`, "--format", "json")
	require.Error(t, err, stdout)
	require.EqualError(t, err, `cannot resolve step 2 ("b"): task 1 is cancelled`)
	require.Empty(t, stdout)
	_ = stderr

	_, _, err = b.run("step", "retry", "1/nope")
	require.EqualError(t, err, `task 1 has no step "nope"`)
	require.Equal(t, 1, exitCode(err))
	_, _, err = b.run("step", "retry", "1/")
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("step", "retry", "x/a")
	require.Equal(t, 2, exitCode(err))

	_, _, err = b.run("step", "resolve", "2", "--output", `{}`, "--format", "xml")
	require.ErrorContains(t, err, `--format "xml"`)
	require.Equal(t, 2, exitCode(err))
}
