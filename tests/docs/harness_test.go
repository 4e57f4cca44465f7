package docs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The docs test's own parts: a mistake here would let a page drift unnoticed.

func TestNormaliseLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`task 5 "nightly" (in_progress): waiting_for_retry`:  `task <n> "nightly" (in_progress): waiting_for_retry`,
		"fetch      10  waiting_for_retry  1/3      in 4.0s": "fetch <n> waiting_for_retry 1/3 in <dur>",
		"backoff until 04:53:27 (in 1m05s)":                  "backoff until <time> (in <dur>)",
		"scheduled to start at 2031-01-01T00:00:00Z":         "scheduled to start at <ts>",
		"2026-11-25T01:30:00Z (2026-11-25 02:30:00 CET)":     "<ts> (<ts> CET)",
		`{"ordinal":1,"task_id":7,"created":true}`:           `{"ordinal":<n>,"task_id":<n>,"created":true}`,
		"concurrency limited by tenant:9: 1 of 1 in flight":  "concurrency limited by tenant:9: <n> of <n> in flight",
		"rate 5/1s, day 2030-01-01, v2, 850ms, 2h03m":        "rate 5/<dur>, day 2030-01-01, v2, <dur>, <dur>",
		"1\ttask 7 created":                                  "<n> task <n> created",
	} {
		require.Equal(t, want, normaliseLine(in), in)
	}
}

func TestMatchOutput(t *testing.T) {
	t.Parallel()
	ok, _ := matchOutput("task 5 created\n…\ndone in 1.2s\n", "task 12 created\na\nb\ndone in 0.4s")
	require.True(t, ok)
	ok, _ = matchOutput("a\n…\n", "a")
	require.True(t, ok)
	ok, diff := matchOutput("attempt 1/3\n", "attempt 2/3\n")
	require.False(t, ok)
	require.Contains(t, diff, "attempt 1/3")
	ok, _ = matchOutput("a\n", "a\nb\n")
	require.False(t, ok, "a line the page does not show")
}

func TestParsePage(t *testing.T) {
	t.Parallel()
	p, err := parsePage("x.md", "text\n"+
		"<!-- docs-test: background until \"tasks:\" scheduler demo --ui-addr '' -->\n"+
		"```sh test poll\nA=$(x)\nscheduler show \\\n  $A\n```\n\n```\nout 1\n```\n"+
		"```yaml file=etl.yaml\nname: etl\n```\n"+
		"```sh\nunmarked\n```\n"+
		"```sh skip\nno reason\n```\n"+
		"  ```sh skip: indented, with a reason\n  make test\n  ```\n"+
		"text\n```\nscheduler task list\n```\n")
	require.NoError(t, err)
	require.Len(t, p.blocks, 7)
	b := p.blocks[0]
	require.Equal(t, "sh", b.lang)
	require.True(t, b.has("poll"))
	require.Len(t, b.directives, 1)
	require.Equal(t, "tasks:", b.directives[0].until)
	require.Equal(t, "scheduler demo --ui-addr ''", b.directives[0].command)
	require.NotNil(t, b.output)
	require.Equal(t, "out 1", b.output.text)
	prefix, last, err := splitLast(b.text)
	require.NoError(t, err)
	require.Equal(t, "A=$(x)", prefix)
	require.Equal(t, "scheduler show \\\n  $A", last)
	require.Equal(t, "etl.yaml", p.blocks[2].fileName())
	require.Nil(t, p.blocks[2].output, "a yaml block after an output block is not an output")
	require.Equal(t, "make test", p.blocks[5].text)
	problems := checkMarks(p)
	require.Len(t, problems, 3, "%v", problems)
	require.Contains(t, problems[0], "x.md:15: shell block not marked")
	require.Contains(t, problems[1], "x.md:18: `skip` without a reason")
	require.Contains(t, problems[2], "x.md:25: commands in a block without a shell language")

	_, _, err = splitLast("cat > f <<'YAML'\na: 1\nYAML")
	require.Error(t, err)
	prefix, last, err = splitLast("cat > f <<'YAML'\na: 1\nYAML\nscheduler apply f   # comment\n# trailing\n")
	require.NoError(t, err)
	require.Equal(t, "cat > f <<'YAML'\na: 1\nYAML", prefix)
	require.Equal(t, "scheduler apply f   # comment", last)
}
