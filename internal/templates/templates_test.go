package templates

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/examples"
	"github.com/stepready/stepready/rules"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestParseConvertsYAMLToJSON(t *testing.T) {
	t.Parallel()
	tmpl, err := Parse("t.yaml", []byte(`
# comments are fine
name: demo
retry: {policy: standard}
steps:
  - name: a
    handler: fail
    input: {times: 2, class: transient, ratio: 0.5, on: true, none: ~}
  - name: b
    handler: noop
    depends_on: [a]
`))
	require.NoError(t, err)
	require.Equal(t, "demo", tmpl.Name)
	require.Equal(t, "t.yaml", tmpl.File)
	require.JSONEq(t, `{"name": "demo", "retry": {"policy": "standard"}, "steps": [
		{"name": "a", "handler": "fail", "input": {"times": 2, "class": "transient", "ratio": 0.5, "on": true, "none": null}},
		{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`, string(tmpl.Definition))
}

func TestParseIsStrict(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, yaml, want string
	}{
		{"duplicate key", "name: a\nname: b\n", `mapping key "name" already defined`},
		{"duplicate nested key", "name: a\nsteps:\n  - {name: x, name: y}\n", `mapping key "name" already defined`},
		{"two documents", "name: a\n---\nname: b\n", "one template per file"},
		{"empty", "", "empty document"},
		{"only a comment", "# nothing\n", "empty document"},
		{"a sequence", "- a\n- b\n", "a template is a mapping"},
		{"a scalar", "hello\n", "a template is a mapping"},
		{"no name", "steps: []\n", "name: a non-empty string is required"},
		{"empty name", "name: ''\n", "name: a non-empty string is required"},
		{"name not a string", "name: 12\n", "name: a non-empty string is required"},
		{"not JSON", "name: a\nsteps: [{input: {x: .inf}}]\n", "not representable as JSON"},
		{"syntax", "name: [a\n", "t.yaml"},
		{"alias bomb", "name: a\n" + aliasBomb, "too large: more than 100000 values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("t.yaml", []byte(tt.yaml))
			require.ErrorContains(t, err, tt.want)
			require.ErrorContains(t, err, "t.yaml", "the error names the file")
		})
	}
}

// aliasBomb expands to 10^7 strings.
const aliasBomb = `a: &a ["x","x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]
`

func FuzzParse(f *testing.F) {
	for _, seed := range []string{"name: a\nsteps: [{name: s, handler: noop}]\n", "name: a\nname: b\n",
		"- 1\n", "a: &x {b: *x}\n", "name: x\n---\n", "{name: \"\\u00e9\", n: 1e400}"} {
		f.Add([]byte(seed))
	}
	// More seeds (valid and invalid YAML, bad CEL, dependency and alias cycles, huge numbers) are committed in
	// testdata/fuzz/FuzzParse.
	f.Fuzz(func(t *testing.T, data []byte) {
		// A task file (scheduler task create -f) goes through the same decoder: it never panics either, and
		// every error names the file.
		if _, err := ParseDefinition("fuzz.yaml", data); err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "fuzz.yaml: "), "the error names the file: %v", err)
		}
		tmpl, err := Parse("fuzz.yaml", data)
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "fuzz.yaml: "), "the error names the file: %v", err)
			return
		}
		var def map[string]any
		require.NoError(t, json.Unmarshal(tmpl.Definition, &def), "the definition is a JSON object")
		require.Equal(t, tmpl.Name, def["name"])
		require.NotContains(t, def, "version", "the version is not part of the definition")
		require.GreaterOrEqual(t, tmpl.Version, 1)
		require.NoError(t, rules.Validate(tmpl.Definition), "an accepted template's rules compile")
	})
}

func TestLoadReadsEveryYAMLFileInOrder(t *testing.T) {
	t.Parallel()
	ts, err := Load(fstest.MapFS{
		"b.yml":      {Data: []byte("name: second\n")},
		"a.yaml":     {Data: []byte("name: first\n")},
		"README.md":  {Data: []byte("not a template")},
		"sub/c.yaml": {Data: []byte("name: nested\n")},
	})
	require.NoError(t, err)
	require.Len(t, ts, 2)
	require.Equal(t, []string{"first", "second"}, []string{ts[0].Name, ts[1].Name})

	_, err = Load(fstest.MapFS{"a.yaml": {Data: []byte("name: x\n")}, "b.yaml": {Data: []byte("name: x\n")}})
	require.ErrorContains(t, err, `a.yaml and b.yaml both define the template "x"`)

	_, err = Load(fstest.MapFS{"README.md": {Data: []byte("no templates")}})
	require.ErrorContains(t, err, "no *.yaml or *.yml file")
}

func TestExamplesAreValidTemplates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	ts, err := Load(examples.FS)
	require.NoError(t, err)
	var names []string
	for _, tmpl := range ts {
		names = append(names, tmpl.Name)
	}
	require.Equal(t, []string{"approval", "dataflow", "diamond", "exhausts", "fanout", "flaky", "permanent"}, names)

	require.NoError(t, Store(ctx, db.Pool, ts), "the database accepts every example")
	require.NoError(t, Store(ctx, db.Pool, ts), "storing again replaces version 1")
	var versions int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM stepready.task_templates").Scan(&versions))
	require.Equal(t, len(ts), versions)

	for _, tmpl := range ts {
		id, err := CreateTask(ctx, db.Pool, tmpl.Name)
		require.NoError(t, err)
		var name string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT name FROM stepready.tasks WHERE id = $1", id).Scan(&name))
		require.Equal(t, tmpl.Name, name)
	}
}

func TestStoreReportsTheDatabasesValidationWithTheFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	good, err := Parse("good.yaml", []byte("name: good\nsteps: [{name: a, handler: noop}]\n"))
	require.NoError(t, err)
	bad, err := Parse("bad.yaml", []byte("name: bad\nsteps: [{name: a, handler: noop, depends_on: [nope]}]\n"))
	require.NoError(t, err)

	err = Store(ctx, db.Pool, []Template{good, bad})
	require.ErrorContains(t, err, `bad.yaml: store template "bad"`)
	require.ErrorContains(t, err, `depends_on: unknown step "nope"`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the SQLSTATE stays reachable")

	var stored int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM stepready.task_templates").Scan(&stored))
	require.Zero(t, stored, "one transaction: nothing is stored")

	_, err = CreateTask(ctx, db.Pool, "missing")
	require.ErrorContains(t, err, `template "missing" does not exist`)
}

func TestParseReportsUnknownKeysWithTheirLine(t *testing.T) {
	t.Parallel()
	_, err := Parse("t.yaml", []byte("name: x\nsteps:\n  - name: a\n    hanlder: noop\n"))
	require.ErrorContains(t, err, `t.yaml: [4:5] unknown field "hanlder"`)

	_, err = Parse("t.yaml", []byte("name: x\nretry:\n  policy: standard\n  max_attempt: 3\nsteps: []\n"))
	require.ErrorContains(t, err, `t.yaml: [4:3] unknown field "max_attempt"`)

	_, err = ParseDefinition("task.yaml", []byte("name: x\nversion: 2\nsteps: []\n"))
	require.ErrorContains(t, err, `task.yaml: [2:1] unknown field "version"`)
}

func TestParseReadsTheVersion(t *testing.T) {
	t.Parallel()
	tmpl, err := Parse("t.yaml", []byte("name: x\nversion: 3\nsteps: [{name: a, handler: noop}]\n"))
	require.NoError(t, err)
	require.Equal(t, 3, tmpl.Version)
	require.JSONEq(t, `{"name": "x", "steps": [{"name": "a", "handler": "noop"}]}`, string(tmpl.Definition))

	tmpl, err = Parse("t.yaml", []byte("name: x\nsteps: [{name: a, handler: noop}]\n"))
	require.NoError(t, err)
	require.Equal(t, 1, tmpl.Version)

	for _, bad := range []string{"0", "-1", "two", "1.5"} {
		_, err = Parse("t.yaml", []byte("name: x\nversion: "+bad+"\nsteps: []\n"))
		require.ErrorContains(t, err, "t.yaml: version: must be an integer >= 1", bad)
	}
}

func TestParseCompilesTheRules(t *testing.T) {
	t.Parallel()
	doc := "name: x\nsteps:\n  - name: a\n    handler: noop\n    rules:\n      - {when: 'attempt >', then: {do: retry}}\n"
	_, err := Parse("t.yaml", []byte(doc))
	require.ErrorContains(t, err, `t.yaml: steps[0] "a": rules[0].when: `)
	_, err = ParseDefinition("task.yaml", []byte(doc))
	require.ErrorContains(t, err, `task.yaml: steps[0] "a": rules[0].when: `)

	_, err = Parse("t.yaml", []byte("name: x\nsteps:\n  - name: a\n    handler: noop\n    rules:\n      - {when: 'attempt > 2', then: {do: fail}}\n"))
	require.NoError(t, err)
}

// TestParseDefinitions: a YAML stream, a JSON array and a YAML sequence each give one definition per element;
// a single mapping gives one and is not a stream; errors name the file and the definition's index.
func TestParseDefinitions(t *testing.T) {
	t.Parallel()
	one := "name: a\nsteps:\n  - name: s\n    handler: noop\n"
	for _, tc := range []struct {
		name, data string
		want       []string
		stream     bool
	}{
		{"single mapping", one, []string{"a"}, false},
		{"YAML stream", one + "---\n" + strings.Replace(one, "name: a", "name: b", 1), []string{"a", "b"}, true},
		{"JSON array", `[{"name": "a", "steps": [{"name": "s", "handler": "noop"}]},
			{"name": "b", "steps": [{"name": "s", "handler": "noop"}]}]`, []string{"a", "b"}, true},
		{"YAML sequence of one", "- " + strings.ReplaceAll(one, "\n", "\n  "), []string{"a"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defs, stream, err := ParseDefinitions("f.yaml", []byte(tc.data))
			require.NoError(t, err)
			require.Equal(t, tc.stream, stream)
			var names []string
			for _, d := range defs {
				var v struct{ Name string }
				require.NoError(t, json.Unmarshal(d, &v))
				names = append(names, v.Name)
			}
			require.Equal(t, tc.want, names)
		})
	}
	for _, tc := range []struct{ name, data, want string }{
		{"unknown key", one + "---\nname: b\nstepz: []\n", `f.yaml: definitions[1]: `},
		{"not a mapping", `[{"name": "a", "steps": []}, 3]`, `f.yaml: definitions[1]: a template is a mapping`},
		{"bad rule", "[{name: a, steps: [{name: s, handler: h, rules: [{when: 'nope >', then: {do: fail}}]}]}]",
			`f.yaml: definitions[0]: steps[0] "s": rules[0].when:`},
		{"empty sequence", `[]`, `f.yaml: an empty sequence`},
		{"empty", ``, `f.yaml: empty document`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseDefinitions("f.yaml", []byte(tc.data))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// Wait steps (SPEC §20) in YAML: the keys are known, an unknown one is reported with its line, and the
// database's checks name the step (a handler beside the wait, a negative timeout).
func TestParseWaitSteps(t *testing.T) {
	t.Parallel()
	tmpl, err := Parse("w.yaml", []byte(`
name: approval
steps:
  - {name: charge, handler: noop}
  - name: approve
    depends_on: [charge]
    wait: {signal: approval, timeout_ms: 86400000, on_timeout: fail}
  - {name: remind, depends_on: [charge], wait: {duration_ms: 5000}}
  - {name: at, depends_on: [charge], wait: {until: "${deps.charge.remind_at}"}}
`))
	require.NoError(t, err)
	require.JSONEq(t, `{"name": "approval", "steps": [{"name": "charge", "handler": "noop"},
		{"name": "approve", "depends_on": ["charge"], "wait": {"signal": "approval", "timeout_ms": 86400000, "on_timeout": "fail"}},
		{"name": "remind", "depends_on": ["charge"], "wait": {"duration_ms": 5000}},
		{"name": "at", "depends_on": ["charge"], "wait": {"until": "${deps.charge.remind_at}"}}]}`, string(tmpl.Definition))

	_, err = Parse("w.yaml", []byte("name: x\nsteps:\n  - name: a\n    wait: {signal: s, timout_ms: 5}\n"))
	require.ErrorContains(t, err, `w.yaml: [4:23] unknown field "timout_ms"`)

	db := pgtest.New(t)
	for yaml, want := range map[string]string{
		"name: b\nsteps: [{name: a, handler: noop, wait: {signal: s}}]\n":  `steps[0] "a": handler and wait`,
		"name: c\nsteps: [{name: a, wait: {signal: s, timeout_ms: -1}}]\n": `steps[0] "a": wait.timeout_ms: must be an integer >= 0, got -1`,
	} {
		bad, err := Parse("bad.yaml", []byte(yaml))
		require.NoError(t, err)
		require.ErrorContains(t, Store(t.Context(), db.Pool, []Template{bad}), want)
	}
}
