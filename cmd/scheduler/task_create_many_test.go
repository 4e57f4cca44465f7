package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestTaskCreateStreamsLargeFiles: -f with JSON lines or a YAML stream reads one definition at a time and sends
// batches of 1,000 (so any size fits in bounded memory), in one transaction: keys repeated across batches find
// the task of the earlier batch, an invalid definition in a later batch is reported with its line and index in
// the file and creates nothing, and a line that is not JSON is named.
func TestTaskCreateStreamsLargeFiles(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	dir := t.TempDir()
	const n = 2500
	lines := make([]string, 0, n+2)
	for i := range n {
		key := fmt.Sprintf("k%d", i)
		if i == 2200 {
			key = "k5" // the key of a definition of the first batch
		}
		lines = append(lines, fmt.Sprintf(`{"name": "t%d", "idempotency_key": %q, "steps": [{"name": "a", "handler": "noop"}, `+
			`{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`, i, key))
		if i == 1500 {
			lines = append(lines, "") // blank lines are skipped, and counted
		}
	}
	file := writeFile(t, dir, "tasks.jsonl", strings.Join(lines, "\n")+"\n")
	stdout, stderr, err := b.run("task", "create", "-f", file, "-o", "json")
	require.NoError(t, err, stderr)
	require.Empty(t, stderr, "no progress line when standard error is not a terminal")
	out := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, out, n)
	require.Equal(t, `{"ordinal":1,"task_id":1,"created":true}`, out[0])
	require.Equal(t, `{"ordinal":2201,"task_id":6,"created":false}`, out[2200])
	require.Equal(t, fmt.Sprintf(`{"ordinal":%d,"task_id":%d,"created":true}`, n, n-1), out[n-1])
	require.Equal(t, int64(n-1), b.int64(`SELECT count(*) FROM stepready.tasks`))
	require.Equal(t, int64(n-1), b.int64(`SELECT count(*) FROM stepready.step_edges`))

	// An invalid definition on line 2,402 (definitions[2400]: a blank line before it), in the third batch:
	// nothing of the file is created.
	bad := append([]string(nil), lines...)
	bad[2401] = `{"name": "bad", "steps": [{"name": "a", "handler": "noop", "depends_on": ["nope"]}]}`
	before := b.int64(`SELECT count(*) FROM stepready.tasks`)
	_, _, err = b.run("task", "create", "-f", writeFile(t, dir, "bad.jsonl", strings.Join(bad, "\n")))
	require.Error(t, err)
	require.ErrorContains(t, err, `bad.jsonl:2402: definitions[2400]: steps[0] "a": depends_on: unknown step "nope"`)
	require.Equal(t, before, b.int64(`SELECT count(*) FROM stepready.tasks`), "nothing of the file")

	notJSON := append([]string(nil), lines[:3]...)
	notJSON = append(notJSON, `{"name": "x", "steps": [`)
	_, _, err = b.run("task", "create", "-f", writeFile(t, dir, "broken.jsonl", strings.Join(notJSON, "\n")))
	require.Error(t, err)
	require.ErrorContains(t, err, "broken.jsonl:4: not a JSON object")

	// A YAML stream: documents one at a time; the third has an unknown key.
	stream := "# tasks\n---\nname: y1\nsteps:\n  - name: s\n    handler: noop\n---\nname: y2\nsteps:\n  - name: s\n" +
		"    handler: noop\n...\n--- \nname: y3\nsteps:\n  - name: s\n    handlr: noop\n"
	_, _, err = b.run("task", "create", "-f", writeFile(t, dir, "bad.yaml", stream))
	require.Error(t, err)
	require.ErrorContains(t, err, "bad.yaml:14: definitions[2]: [4:5] unknown field \"handlr\"")
	stdout, stderr, err = b.run("task", "create", "-f", writeFile(t, dir, "ok.yaml",
		strings.Replace(stream, "handlr", "handler", 1)))
	require.NoError(t, err, stderr)
	require.Equal(t, fmt.Sprintf("1\ttask %d created\n2\ttask %d created\n3\ttask %d created\n3 of 3 tasks created\n",
		n, n+1, n+2), stdout)
}

// TestTaskCreateManySaysTheirStart: a file of many definitions, or a template with --contexts-file, says on the
// line of each created task whose start is still to come when it starts (its run_at in the file, or --run-at /
// --in for every task), as the create of a single task does; JSON adds run_at. A run_at already past, or a task
// an idempotency key found, says nothing.
func TestTaskCreateManySaysTheirStart(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	dir := t.TempDir()

	lines := writeFile(t, dir, "tasks.jsonl",
		`{"name": "a", "run_at": "2030-01-01T03:00:00+01:00", "steps": [{"name": "s", "handler": "noop"}]}`+"\n"+
			`{"name": "b", "steps": [{"name": "s", "handler": "noop"}], "context": {"note": "\"run_at\" in a value"}}`+"\n"+
			`{"name": "c", "run_at": "2001-01-01T00:00:00Z", "steps": [{"name": "s", "handler": "noop"}]}`+"\n")
	stdout, stderr, err := b.run("task", "create", "-f", lines)
	require.NoError(t, err, stderr)
	require.Equal(t, "1\ttask 1 created, scheduled to start at 2030-01-01T02:00:00Z\n2\ttask 2 created\n"+
		"3\ttask 3 created\n3 of 3 tasks created\n", stdout)

	stream := writeFile(t, dir, "tasks.yaml", "name: d\nrun_at: 2030-01-01T02:00:00Z\nsteps:\n  - {name: s, handler: noop}\n"+
		"---\nname: e\nsteps:\n  - {name: s, handler: noop}\n")
	stdout, stderr, err = b.run("task", "create", "-f", stream, "-o", "json")
	require.NoError(t, err, stderr)
	require.Equal(t, `{"ordinal":1,"task_id":4,"created":true,"run_at":"2030-01-01T02:00:00Z"}`+"\n"+
		`{"ordinal":2,"task_id":5,"created":true}`+"\n", stdout)

	stdout, stderr, err = b.run("task", "create", "-f", stream, "--run-at", "2031-01-01T00:00:00Z")
	require.NoError(t, err, stderr)
	require.Equal(t, "1\ttask 6 created, scheduled to start at 2031-01-01T00:00:00Z\n"+
		"2\ttask 7 created, scheduled to start at 2031-01-01T00:00:00Z\n2 of 2 tasks created\n", stdout)

	_, stderr, err = b.run("template", "apply", writeFile(t, dir, "etl.yaml", etlTemplate))
	require.NoError(t, err, stderr)
	contexts := writeFile(t, dir, "days.jsonl", "{\"day\": 1}\n{\"day\": 2}\n")
	stdout, stderr, err = b.run("task", "create", "etl", "--contexts-file", contexts, "--run-at", "2031-01-01T00:00:00Z")
	require.NoError(t, err, stderr)
	require.Equal(t, "1\ttask 8 created, scheduled to start at 2031-01-01T00:00:00Z\n"+
		"2\ttask 9 created, scheduled to start at 2031-01-01T00:00:00Z\n2 of 2 tasks created\n", stdout)
	stdout, stderr, err = b.run("task", "create", "etl", "--contexts-file", contexts, "--in", "1h", "-o", "json")
	require.NoError(t, err, stderr)
	require.Regexp(t, `^\{"ordinal":1,"task_id":10,"created":true,"run_at":"20\d\d-[^"]+Z"\}`+"\n", stdout)
	require.Equal(t, int64(2), b.int64(`SELECT count(*) FROM stepready.tasks WHERE id IN (10, 11) AND run_at > now() + interval '59 minutes'`))
}

// TestProgressLine: `task create -f` shows its progress only on a character device (a terminal), at most four
// times a second, on one line that it ends once done; elsewhere (a pipe, a file, the tests' buffers) nothing.
func TestProgressLine(t *testing.T) {
	t.Parallel()
	require.Nil(t, newProgressLine(&bytes.Buffer{}), "not a file")
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer f.Close()
	require.Nil(t, newProgressLine(f), "a regular file")
	var none *progressLine
	none.update(1, 1) // a nil line shows nothing
	none.done()

	tty, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer tty.Close()
	require.NotNil(t, newProgressLine(tty), "a character device")

	var out bytes.Buffer
	p := &progressLine{w: &out, begin: time.Now().Add(-time.Second)}
	p.update(1000, 1000)
	p.update(2000, 2000) // within 250 ms of the last: not shown
	require.Regexp(t, `^\r1000 definitions read, 1000 sent \(\d+/s\), not committed yet $`, out.String())
	p.done()
	require.True(t, strings.HasSuffix(out.String(), " \n"), "the line is ended once done: %q", out.String())

	out.Reset()
	(&progressLine{w: &out, begin: time.Now()}).done()
	require.Empty(t, out.String(), "no line shown, none ended")
}
