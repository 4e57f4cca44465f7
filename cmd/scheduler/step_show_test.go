package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// `scheduler step show` prints a step's input as defined and as resolved now (or why it does not resolve yet),
// its deps and its output, long documents cut in the table; --output json has them whole.
func TestStepShow(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	task := b.createTask(`{"name": "flow", "context": {"region": "eu"}, "steps": [
		{"name": "list", "handler": "noop"},
		{"name": "report", "handler": "noop", "depends_on": ["list"],
		 "input": {"first": "${deps.list.files.0}", "where": "${context.region}"}}]}`)
	list := b.stepID(task, "list")
	stdout, stderr, err := b.run("step", "show", "1/report")
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, `step 2 "report" (task 1), handler noop`)
	require.Contains(t, stdout, `input resolved now: does not resolve yet: input reference ${deps.list.files.0}: deps.list.files.0 not found`)
	require.Contains(t, stdout, "deps: {}\n")
	require.Contains(t, stdout, "output: -\n")

	long := strings.Repeat("x", 1000)
	b.exec(`UPDATE stepready.steps SET state = 'complete', attempts = 1, output = jsonb_build_object('files', jsonb_build_array('a.csv'), 'pad', $2::text) WHERE id = $1`,
		list, long)
	stdout, stderr, err = b.run("step", "show", "2")
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, `input: {"first": "${deps.list.files.0}", "where": "${context.region}"}`)
	require.Contains(t, stdout, `input resolved now: {"first": "a.csv", "where": "eu"}`)
	require.Contains(t, stdout, `deps: {"list": {"pad": "xxx`)
	require.Contains(t, stdout, "… (1041 bytes; --output json for all of it)")

	// task show: the output cut in the table, whole in json.
	stdout, stderr, err = b.run("task", "show", "1")
	require.NoError(t, err, stderr)
	require.Regexp(t, `list +1 +complete .* \{"pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxx\.\.\.\n`, stdout)
	stdout, stderr, err = b.run("task", "show", "1", "--output", "json")
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, long)

	stdout, stderr, err = b.run("step", "show", "2", "--output", "json")
	require.NoError(t, err, stderr)
	var got struct {
		Deps          map[string]map[string]any `json:"deps"`
		ResolvedInput map[string]string         `json:"resolved_input"`
		InputProblem  *string                   `json:"input_problem"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &got))
	require.Equal(t, long, got.Deps["list"]["pad"], "whole in json")
	require.Equal(t, map[string]string{"first": "a.csv", "where": "eu"}, got.ResolvedInput)
	require.Nil(t, got.InputProblem)

	_, _, err = b.run("step", "show", "99")
	require.EqualError(t, err, "step 99 does not exist")
}
