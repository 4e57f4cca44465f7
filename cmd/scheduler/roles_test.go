package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOperatorCommandsAsOperatorRole: the CLI's operator commands work for a login role that has only
// stepready_operator (SPEC §17), and the same role cannot claim steps or create tasks.
func TestOperatorCommandsAsOperatorRole(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	dir := t.TempDir()
	_, stderr, err := b.run("template", "apply", writeFile(t, dir, "etl.yaml", etlTemplate))
	require.NoError(t, err, stderr)
	_, stderr, err = b.run("task", "create", "etl")
	require.NoError(t, err, stderr)

	operator := b.db.LoginRole(t, "stepready_operator")
	run := func(args ...string) (string, error) {
		stdout, _, err := executeIsolated(context.Background(), t, append(args, "--database-url", operator)...)
		return stdout, err
	}
	for _, args := range [][]string{
		{"task", "pause", "1"},
		{"task", "resume", "1"},
		{"step", "retry", "1/fetch"},
		{"task", "cancel", "1"},
		{"task", "reset", "1"},
		{"task", "show", "1"},
		{"explain", "1"},
		{"task", "list"},
		{"template", "apply", writeFile(t, dir, "etl2.yaml", "version: 2\n"+etlTemplate)},
		{"schedule", "create", "nightly", "--template", "etl", "--cron", "@daily"},
		{"schedule", "pause", "nightly"},
	} {
		_, err := run(args...)
		require.NoError(t, err, "scheduler %v as stepready_operator", args)
	}
	require.GreaterOrEqual(t, b.int64(`SELECT count(DISTINCT event) FROM stepready.step_events WHERE event LIKE 'operator.%'`), int64(5),
		"pause, resume, retry, cancel and reset recorded")

	_, err = run("task", "create", "etl")
	require.ErrorContains(t, err, "permission denied", "an operator does not create tasks")
}

// A permission refusal names the roles that grant what was refused: a reader may not cancel.
func TestPermissionRefusalsNameTheRole(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	task := b.createTask(`{"name": "t", "steps": [{"name": "s", "handler": "noop"}]}`)
	reader := b.db.LoginRole(t, "stepready_reader")
	_, _, err := executeIsolated(context.Background(), t, "task", "cancel", fmt.Sprint(task), "--database-url", reader)
	require.ErrorContains(t, err, "permission denied for function cancel_task: grant one of [stepready_operator] to this role")
}
