package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSignalCommands(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	task := b.createTask(`{"name": "refund", "idempotency_key": "refund-3", "steps": [
		{"name": "charge", "handler": "noop"},
		{"name": "approve", "wait": {"signal": "approval"}, "depends_on": ["charge"]},
		{"name": "pay", "wait": {"signal": "paid"}}]}`)
	approve, pay := b.stepID(task, "approve"), b.stepID(task, "pay")

	// Buffered: approve does not wait yet.
	stdout, stderr, err := b.run("signal", "send", "1", "approval", "--payload", `{"by": "ann \"the boss\""}`)
	require.NoError(t, err, stderr)
	require.Equal(t, "signal 1 \"approval\" buffered for task 1: the first step that starts waiting for it takes it\n", stdout)
	// Delivered now, by the task's key, idempotent.
	for range 2 {
		stdout, stderr, err = b.run("signal", "send", "--key", "refund-3", "paid", "--idempotency-key", "evt-1",
			"--output", "json")
		require.NoError(t, err, stderr)
		var sent map[string]any
		require.NoError(t, json.Unmarshal([]byte(stdout), &sent))
		require.Equal(t, float64(2), sent["id"])
		require.Equal(t, true, sent["delivered"])
		require.Equal(t, float64(pay), sent["consumed_by"])
		require.Equal(t, "pay", sent["consumed_by_name"])
	}
	require.Equal(t, int64(1), b.int64(`SELECT count(*) FROM stepready.step_events
		WHERE event = 'signal.received' AND details ->> 'actor' = 'cli' AND details ->> 'signal' = 'paid'`))

	stdout, stderr, err = b.run("signal", "list", "1")
	require.NoError(t, err, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^ID\s+NAME\s+SENT\s+CONSUMED BY\s+CONSUMED AT\s+KEY\s+PAYLOAD$`, lines[0])
	require.Regexp(t, `^1\s+approval\s+\S+\s+buffered\s+-\s+-\s+\{"by": "ann \\"the boss\\""\}$`, lines[1])
	require.Regexp(t, `^2\s+paid\s+\S+\s+3 \(pay\)\s+\S+\s+evt-1\s+\{\}$`, lines[2])
	stdout, _, err = b.run("signal", "list", "1", "--output", "json")
	require.NoError(t, err)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.Len(t, list, 2)
	require.Equal(t, map[string]any{"by": `ann "the boss"`}, list[0]["payload"])
	_ = approve

	// Refusals: the database's message, exit status 1; usage errors exit 2.
	_, _, err = b.run("signal", "send", "1", "paid")
	require.EqualError(t, err, `cannot send signal "paid" to task 1: no step of it that is not finished waits for "paid"`)
	require.Equal(t, 1, exitCode(err))
	_, _, err = b.run("signal", "send", "1", "approval")
	require.ErrorContains(t, err, `have 1 signal(s) buffered already`)
	_, _, err = b.run("signal", "send", "99", "approval")
	require.EqualError(t, err, `cannot send signal "approval": task 99 does not exist`)
	_, _, err = b.run("signal", "send", "1", "approval", "--payload", "{nope")
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("signal", "send", "approval")
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("signal", "list", "99")
	require.EqualError(t, err, "task 99 does not exist")
}
