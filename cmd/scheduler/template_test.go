package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// writeFile writes a file in dir and returns its path.
func writeFile(t *testing.T, dir, name, contents string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(contents), 0o644))
	return path
}

const etlTemplate = `name: etl
context: {source: s3}
steps:
  - name: fetch
    handler: noop
  - name: parse
    handler: noop
    depends_on: [fetch]
`

func TestTemplateApplyListAndTaskCreate(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	dir := t.TempDir()
	etl := writeFile(t, dir, "etl.yaml", etlTemplate)
	etl2 := writeFile(t, dir, "etl2.yaml", "version: 2\n"+etlTemplate+"  - name: load\n    handler: noop\n    depends_on: [parse]\n")

	stdout, stderr, err := b.run("template", "apply", etl, etl2)
	require.NoError(t, err, stderr)
	require.Equal(t, "template etl version 1 created ("+etl+")\ntemplate etl version 2 created ("+etl2+")\n", stdout)

	stdout, _, err = b.run("template", "apply", etl, "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `[{"name": "etl", "version": 1, "file": "`+etl+`", "created": false}]`, stdout)

	stdout, _, err = b.run("template", "list")
	require.NoError(t, err)
	requireGolden(t, "template_list", stdout)
	stdout, _, err = b.run("template", "list", "-o", "json")
	require.NoError(t, err)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.Len(t, list, 2)
	require.Equal(t, true, list[1]["newest"])

	// From the newest version, with a context merged over the template's.
	ctxFile := writeFile(t, dir, "ctx.json", `{"day": "2030-01-01"}`)
	stdout, stderr, err = b.run("task", "create", "etl", "--context", "@"+ctxFile, "--idempotency-key", "etl-1")
	require.NoError(t, err, stderr)
	require.Equal(t, "task 1 created from template etl (3 steps)\n", stdout)
	var taskCtx string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT context::text FROM stepready.tasks WHERE id = 1`).Scan(&taskCtx))
	require.JSONEq(t, `{"source": "s3", "day": "2030-01-01"}`, taskCtx)

	stdout, _, err = b.run("task", "create", "etl", "--idempotency-key", "etl-1", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `{"task_id": 1, "created": false, "template": "etl", "idempotency_key": "etl-1", "steps": 3}`, stdout)

	task := writeFile(t, dir, "task.yaml", "name: adhoc\nidempotency_key: adhoc-1\nsteps:\n  - {name: one, handler: noop}\n")
	stdout, stderr, err = b.run("task", "create", "-f", task)
	require.NoError(t, err, stderr)
	require.Equal(t, "task 2 created from "+task+" (1 step)\n", stdout)
	stdout, _, err = b.run("task", "create", "-f", task)
	require.NoError(t, err)
	require.Equal(t, "task 2 already exists with idempotency key \"adhoc-1\": nothing created\n", stdout)

	_, _, err = b.run("task", "create", "nope")
	require.EqualError(t, err, `template "nope" does not exist`)
	require.Equal(t, 1, exitCode(err))
	_, _, err = b.run("task", "create")
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("task", "create", "etl", "-f", task)
	require.Equal(t, 2, exitCode(err))
	_, _, err = b.run("task", "create", "etl", "--context", "[1,")
	require.ErrorContains(t, err, "--context: not valid JSON")
	require.Equal(t, 2, exitCode(err))
}

// Every validation error of SPEC §10, as a user of `scheduler template apply` and `task create -f` sees it.
func TestTemplateValidationErrors(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", etlTemplate)

	tests := []struct {
		name, yaml, want string
	}{
		{"duplicate step", "name: d\nsteps:\n  - {name: a, handler: noop}\n  - {name: a, handler: noop}\n",
			`steps[1] "a": name: duplicate step name (also steps[0])`},
		{"empty step name", "name: d\nsteps:\n  - {name: '', handler: noop}\n", `steps[0]: name: must be a non-empty string, got ""`},
		{"unknown dependency", "name: d\nsteps:\n  - {name: a, handler: noop, depends_on: [nope]}\n",
			`steps[0] "a": depends_on: unknown step "nope"`},
		{"cycle", "name: d\nsteps:\n  - {name: a, handler: noop, depends_on: [b]}\n  - {name: b, handler: noop, depends_on: [a]}\n",
			`steps[0] "a": depends_on: dependency cycle "a" -> "b" -> "a"`},
		{"unknown preset", "name: d\nsteps:\n  - {name: a, handler: noop, retry: {policy: turbo}}\n",
			`steps[0] "a": retry.policy: unknown preset "turbo" (known: aggressive, none, patient, standard)`},
		{"negative max_attempts", "name: d\nretry: {max_attempts: -1}\nsteps:\n  - {name: a, handler: noop}\n",
			`retry.max_attempts: must be an integer >= 0, got -1`},
		{"negative timeout", "name: d\nsteps:\n  - {name: a, handler: noop, timeout_ms: -5}\n", `steps[0] "a": timeout_ms: must be an integer >= 1, got -5`},
		// Issue 25: the bounds of what reaches River and the Go runtime.
		{"queue River refuses", "name: d\nsteps:\n  - {name: a, handler: noop, queue: 'bad queue!'}\n",
			`steps[0] "a": queue: must be a River queue name: lowercase letters and digits`},
		{"timeout beyond a Go duration", "name: d\nsteps:\n  - {name: a, handler: noop, timeout_ms: 10000000000000000}\n",
			`steps[0] "a": timeout_ms: must be at most 9223372036854 ms`},
		{"rate period beyond a Go duration",
			"name: d\nsteps:\n  - {name: a, handler: noop, rate_limit: {key: api, limit: 1, period_ms: 10000000000000000}}\n",
			`steps[0] "a": rate_limit: period_ms: must be at most 9223372036854 ms`},
		{"bad backoff", "name: d\nsteps:\n  - {name: a, handler: noop, retry: {backoff: quadratic}}\n",
			`steps[0] "a": retry.backoff: unknown strategy "quadratic" (known: none, fixed, linear, exponential)`},
		{"unknown key with its line", "name: d\nsteps:\n  - name: a\n    hanlder: noop\n", "bad.yaml: [4:5] unknown field \"hanlder\"\n   1 | name: d\n   2 | steps:\n   3 |   - name: a\n>  4 |     hanlder: noop\n           ^\n"},
		{"malformed YAML", "name: d\nsteps: [\n", "bad.yaml: [2:8] sequence end token ']' not found\n   1 | name: d\n>  2 | steps: [\n              ^\n"},
		{"bad CEL", "name: d\nsteps:\n  - name: a\n    handler: noop\n    rules:\n      - {when: 'outcome.status ==', then: {do: retry}}\n",
			`bad.yaml: steps[0] "a": rules[0].when: ERROR: <input>:1:18: Syntax error: mismatched input '<EOF>'`},
		{"non-bool when", "name: d\nsteps:\n  - {name: a, handler: noop}\n  - name: b\n    handler: noop\n    rules:\n" +
			"      - {when: \"outcome.status == 'ok'\", then: {do: break}}\n      - {when: 'attempt + 1', then: {do: fail}}\n",
			`bad.yaml: steps[1] "b": rules[1].when: must evaluate to a bool, but "attempt + 1" has type int`},
		{"unknown action", "name: d\nsteps:\n  - name: a\n    handler: noop\n    rules:\n      - {when: 'true', then: {do: explode}}\n",
			`bad.yaml: steps[0] "a": rules[0].then.do: must be one of retry, fail, continue, repeat, break, got "explode"`},
		{"undeclared variable", "name: d\nsteps:\n  - name: a\n    handler: noop\n    rules:\n      - {when: 'nope > 1', then: {do: fail}}\n",
			`bad.yaml: steps[0] "a": rules[0].when: ERROR: <input>:1:1: undeclared reference to 'nope'`},
		{"duplicate key", "name: d\nname: e\nsteps: []\n", `bad.yaml: [2:1] mapping key "name" already defined at [1:1]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := writeFile(t, t.TempDir(), "bad.yaml", tt.yaml)
			stdout, _, err := b.run("template", "apply", good, bad)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
			require.Contains(t, err.Error(), "bad.yaml")
			require.Equal(t, 1, exitCode(err))
			require.Empty(t, stdout)

			// The same definition as a task file.
			_, _, err = b.run("task", "create", "-f", bad)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
			require.NotContains(t, err.Error(), "definitions[0]", "one task's errors name no index")
			require.NotContains(t, err.Error(), "stepready:", "the database's words, not the library's wrapping")
		})
	}
	// Nothing was stored: the good file shared a transaction with every bad one.
	require.Equal(t, int64(0), b.int64(`SELECT count(*) FROM stepready.task_templates`))
	require.Equal(t, int64(0), b.int64(`SELECT count(*) FROM stepready.tasks`))
}
