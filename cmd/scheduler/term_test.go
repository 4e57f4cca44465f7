package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// hostile is a client-supplied name that tries every trick on a terminal: an OSC that retitles it, a cursor move
// up and a carriage return that rewrite the line above, a newline and a tab that forge a row, an 8-bit CSI
// (U+009B), a right-to-left override and DEL.
const hostile = "ok\x1b]0;pwned\x07\x1b[1A\r\n\tforged\u009b2J\u202edesrever\x7f"

// requireTerminalClean fails when out holds a character a terminal would act on: any control character but
// newline and tab, a C1 control, a bidirectional formatting character, or invalid UTF-8.
func requireTerminalClean(t *testing.T, what, out string) {
	t.Helper()
	require.True(t, utf8.ValidString(out), "%s: invalid UTF-8", what)
	for i, r := range out {
		if r != '\n' && r != '\t' && needsEscape(r) {
			t.Fatalf("%s: raw %U at byte %d:\n%s", what, r, i, strconv.Quote(out))
		}
	}
}

// Table and text output escapes the control characters of client-supplied names, errors, namespaces and event
// details visibly (finding 8 of issue 27: a task name could retitle the terminal or rewrite the line above);
// JSON output keeps them as data.
func TestCLIEscapesTerminalControlsInClientText(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	def, err := json.Marshal(map[string]any{"name": hostile, "namespace": hostile, "steps": []map[string]any{
		{"name": "a" + hostile, "handler": "noop"}, {"name": "b", "handler": "noop", "depends_on": []string{"a" + hostile}}}})
	require.NoError(t, err)
	id := b.createTask(string(def))
	b.exec(`UPDATE stepready.steps SET last_error = jsonb_build_object('class', 'transient', 'message', $2::text)
		WHERE task_id = $1 AND name = 'b'`, id, "boom "+hostile)
	b.exec(`SELECT stepready.cancel_task($1, $2)`, id, "why "+hostile)

	visible := `ok\x1b]0;pwned\a\x1b[1A\r\n\tforged\u009b2J\u202edesrever\x7f`
	for _, args := range [][]string{
		{"task", "list"},
		{"task", "show", fmt.Sprint(id)},
		{"task", "events", fmt.Sprint(id)},
		{"explain", fmt.Sprint(id)},
	} {
		stdout, stderr, err := b.run(args...)
		require.NoError(t, err, stderr)
		requireTerminalClean(t, fmt.Sprint(args), stdout)
		require.Contains(t, stdout, "ok\\x1b]0;pwned", "%v: the sequence is shown escaped", args)
		if args[1] == "list" {
			require.Contains(t, stdout, visible, "%v", args)
		}
	}

	stdout, stderr, err := b.run("task", "show", fmt.Sprint(id), "--output", "json")
	require.NoError(t, err, stderr)
	var show struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &show))
	require.Equal(t, hostile, show.Name, "JSON output keeps the data")
	require.Equal(t, hostile, show.Namespace)
}

func TestTermSafe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, safe, writer string }{
		{"plain name · ünïcode ✓", "plain name · ünïcode ✓", "plain name · ünïcode ✓"},
		{"a\tb\nc", `a\tb\nc`, "a\tb\nc"},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`, `\x1b[31mred\x1b[0m`},
		{"x\ry\bz\x00", `x\ry\bz\x00`, `x\ry\bz\x00`},
		{"\u009b2J\u0085", `\u009b2J\u0085`, `\u009b2J\u0085`},
		{"\u202eabc\u2066", `\u202eabc\u2066`, `\u202eabc\u2066`},
		{"bad\xffbyte\xc3", `bad\xffbyte\xc3`, `bad\xffbyte\xc3`},
		{`back\slash`, `back\slash`, `back\slash`},
	} {
		require.Equal(t, tc.safe, termSafe(tc.in), strconv.Quote(tc.in))
		var buf bytes.Buffer
		n, err := termWriter{w: &buf}.Write([]byte(tc.in))
		require.NoError(t, err)
		require.Equal(t, len(tc.in), n)
		require.Equal(t, tc.writer, buf.String(), strconv.Quote(tc.in))
	}
}
