package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTaskCreateBulk: -f with a YAML stream or a JSON array, and TEMPLATE --contexts-file with JSON lines, create
// many tasks in one transaction, one output line (or JSON object) per task; a bad element creates nothing.
func TestTaskCreateBulk(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	dir := t.TempDir()

	stream := writeFile(t, dir, "tasks.yaml", "name: a\nidempotency_key: ka\nsteps:\n  - name: s\n    handler: noop\n"+
		"---\nname: b\nsteps:\n  - name: s\n    handler: noop\n  - name: t\n    handler: noop\n    depends_on: [s]\n")
	stdout, stderr, err := b.run("task", "create", "-f", stream)
	require.NoError(t, err, stderr)
	require.Equal(t, "1\ttask 1 created\n2\ttask 2 created\n2 of 2 tasks created\n", stdout)
	require.Equal(t, int64(3), b.int64(`SELECT count(*) FROM stepready.steps`))

	array := writeFile(t, dir, "tasks.json", `[{"name": "a", "idempotency_key": "ka", "steps": [{"name": "s", "handler": "noop"}]},
		{"name": "c", "steps": [{"name": "s", "handler": "noop"}]}]`)
	stdout, stderr, err = b.run("task", "create", "-f", array, "-o", "json")
	require.NoError(t, err, stderr)
	require.Equal(t, `{"ordinal":1,"task_id":1,"created":false}`+"\n"+`{"ordinal":2,"task_id":3,"created":true}`+"\n", stdout)

	bad := writeFile(t, dir, "bad.json", `[{"name": "d", "steps": [{"name": "s", "handler": "noop"}]},
		{"name": "e", "steps": [{"name": "s", "handler": "noop", "depends_on": ["x"]}]}]`)
	_, _, err = b.run("task", "create", "-f", bad)
	require.Error(t, err)
	require.ErrorContains(t, err, `definitions[1]: steps[0] "s": depends_on: unknown step "x"`)
	require.Equal(t, int64(3), b.int64(`SELECT count(*) FROM stepready.tasks`), "nothing of the bad file written")

	_, stderr, err = b.run("template", "apply", writeFile(t, dir, "etl.yaml", etlTemplate))
	require.NoError(t, err, stderr)
	contexts := writeFile(t, dir, "days.jsonl", "{\"day\": 1}\n\n{\"day\": 2}\n")
	stdout, stderr, err = b.run("task", "create", "etl", "--contexts-file", contexts)
	require.NoError(t, err, stderr)
	require.Equal(t, "1\ttask 4 created\n2\ttask 5 created\n2 of 2 tasks created\n", stdout)
	require.Equal(t, int64(2), b.int64(`SELECT count(*) FROM stepready.tasks WHERE context ? 'day' AND context ? 'source'`))

	_, _, err = b.run("task", "create", "etl", "--contexts-file", writeFile(t, dir, "bad.jsonl", "{}\nnope\n"))
	require.Error(t, err)
	require.ErrorContains(t, err, "bad.jsonl:2: not a JSON value")
	_, _, err = b.run("task", "create", "--contexts-file", contexts)
	require.Error(t, err)
	require.ErrorContains(t, err, "--contexts-file needs a TEMPLATE")
}
