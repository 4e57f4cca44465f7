package stepready_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/templates"
	"github.com/stepready/stepready/rules"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// FuzzCreateTask hands arbitrary documents to stepready.CreateTask (the committed corpus is in
// testdata/fuzz/FuzzCreateTask; every example task definition is a seed too). Whatever the document, it must
// either create the task, with one row per step holding the step's input, or fail with ErrInvalidDefinition
// and write nothing: never another error, never a panic, never half a task.
func FuzzCreateTask(f *testing.F) {
	db := pgtest.New(f)
	for _, def := range exampleDefinitions(f) {
		f.Add([]byte(def))
	}
	f.Fuzz(func(t *testing.T, definition []byte) {
		checkCreateTask(t, db, definition)
	})
}

// FuzzCreateTaskStep fuzzes the input and the settings of one step of an otherwise valid definition (committed
// corpus in testdata/fuzz/FuzzCreateTaskStep). present says which settings the step has (bit i for
// stepSettings[i]). An oracle written from SPEC §2, §3 and §10 says whether the settings are valid: valid ones
// must be accepted and stored exactly as given (or resolved from the preset, then from `standard`), invalid ones
// refused with ErrInvalidDefinition and a message naming the step and one of the bad fields. The input is any
// JSON (bytes that are not JSON are sent as a JSON string); it is stored as given, and refused only when jsonb
// cannot hold it.
func FuzzCreateTaskStep(f *testing.F) {
	db := pgtest.New(f)
	presets := loadPresets(f, db)
	f.Add([]byte(`{"url": "http://api.example.test/v1/items", "query": {"page": 1}}`), uint16(0x3fff), "aggressive",
		int64(5), true, "exponential", int64(20), 2.0, int64(30000), 0.5, int64(300), int64(3), "skip", "append",
		int64(50), "outcome.status == 'error' && outcome.http.status in [429, 503]")
	f.Add([]byte(`{"query": "SELECT $1::int", "args": [1e400, "\u00e9", null]}`), uint16(0x00ff), "none",
		int64(0), false, "none", int64(0), 1.0, int64(0), 1.0, int64(1), int64(0), "skip_cascade", "merge",
		int64(1), "true")
	f.Add([]byte(`not json`), uint16(0x3fff), "bogus", int64(-1), false, "quadratic", int64(-5), 0.5, int64(-1),
		1.5, int64(0), int64(-1), "retry", "prepend", int64(0), "outcome.nope ==")
	f.Fuzz(func(t *testing.T, input []byte, present uint16, policy string, maxAttempts int64, retryable bool,
		backoff string, baseDelay int64, multiplier float64, maxDelay int64, jitter float64, timeoutMS int64,
		breakerLimit int64, onExhausted, collect string, maxIterations int64, when string) {
		if math.IsNaN(multiplier) || math.IsInf(multiplier, 0) || math.IsNaN(jitter) || math.IsInf(jitter, 0) {
			return // not representable in JSON
		}
		if !json.Valid(input) {
			input, _ = json.Marshal(string(input))
		}
		values := []any{policy, maxAttempts, retryable, backoff, baseDelay, multiplier, maxDelay, jitter, timeoutMS,
			breakerLimit, onExhausted, collect, maxIterations, when}
		c := stepCase{input: input, set: map[string]any{}}
		for i, setting := range stepSettings {
			if present&(1<<i) != 0 {
				c.set[setting.name] = values[i]
			}
		}
		checkStepCase(t, db, presets, c)
	})
}

// stepSetting is one fuzzed setting of a step: its name, and whether a value is valid.
type stepSetting struct {
	name  string
	valid func(v any, presets map[string]preset) bool
}

func intIn(lo, hi int64) func(v any, _ map[string]preset) bool {
	return func(v any, _ map[string]preset) bool { return v.(int64) >= lo && v.(int64) <= hi }
}

func oneOf(names ...string) func(v any, _ map[string]preset) bool {
	return func(v any, _ map[string]preset) bool { return slices.Contains(names, v.(string)) }
}

// maxDurationMS is the bound of every duration of a definition (issue 25): the longest Go time.Duration, in ms.
const maxDurationMS = math.MaxInt64 / 1_000_000

// stepSettings is the order of FuzzCreateTaskStep's arguments and of the bits of present.
var stepSettings = []stepSetting{
	{"policy", func(v any, p map[string]preset) bool { _, ok := p[v.(string)]; return ok }},
	{"max_attempts", intIn(0, math.MaxInt32)},
	{"retryable", func(any, map[string]preset) bool { return true }},
	{"backoff", oneOf("none", "fixed", "linear", "exponential")},
	{"base_delay_ms", intIn(0, maxDurationMS)},
	{"multiplier", func(v any, _ map[string]preset) bool { return v.(float64) >= 1 && v.(float64) <= 1e300 }},
	{"max_delay_ms", intIn(0, maxDurationMS)},
	{"jitter", func(v any, _ map[string]preset) bool { return v.(float64) >= 0 && v.(float64) <= 1 }},
	{"timeout_ms", intIn(1, maxDurationMS)},
	{"breaker_limit", intIn(0, math.MaxInt32)},
	{"on_exhausted", oneOf("fail_task", "skip", "skip_cascade")},
	{"collect", oneOf("append", "replace", "merge")},
	{"max_iterations", intIn(1, math.MaxInt32)},
	{"rules", func(v any, _ map[string]preset) bool {
		_, err := rules.Compile(stepRules(v.(string)))
		return err == nil
	}},
}

// retrySettings are the settings that go in the step's `retry` object.
var retrySettings = []string{"policy", "max_attempts", "retryable", "backoff", "base_delay_ms", "multiplier",
	"max_delay_ms", "jitter"}

// stepRules is the rules document of a fuzzed `when`.
func stepRules(when string) json.RawMessage {
	b, _ := json.Marshal([]any{map[string]any{"when": when, "then": map[string]any{"do": "retry", "max_attempts": 2}}})
	return b
}

// preset is a row of stepready.retry_policies.
type preset struct {
	MaxAttempts int64
	Retryable   bool
	Backoff     string
	BaseDelayMS int64
	Multiplier  float64
	MaxDelayMS  *int64
	Jitter      float64
}

func loadPresets(tb testing.TB, db *pgtest.DB) map[string]preset {
	tb.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT name, max_attempts, retryable, backoff, base_delay_ms,
		multiplier, max_delay_ms, jitter FROM stepready.retry_policies`)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	out := map[string]preset{}
	for rows.Next() {
		var name string
		var p preset
		if err := rows.Scan(&name, &p.MaxAttempts, &p.Retryable, &p.Backoff, &p.BaseDelayMS, &p.Multiplier,
			&p.MaxDelayMS, &p.Jitter); err != nil {
			tb.Fatal(err)
		}
		out[name] = p
	}
	if err := rows.Err(); err != nil || len(out) == 0 {
		tb.Fatalf("no presets: %v", err)
	}
	return out
}

// stepCase is one fuzzed step: its input and the settings it has.
type stepCase struct {
	input json.RawMessage
	set   map[string]any
}

// definition returns the task definition of c: step "s" with c's settings, and step "after" depending on it.
func (c stepCase) definition() []byte {
	step := map[string]any{"name": "s", "handler": "h", "input": c.input}
	retry := map[string]any{}
	for k, v := range c.set {
		switch {
		case slices.Contains(retrySettings, k):
			retry[k] = v
		case k == "rules":
			step[k] = stepRules(v.(string))
		default:
			step[k] = v
		}
	}
	if len(retry) > 0 {
		step["retry"] = retry
	}
	def, _ := json.Marshal(map[string]any{"name": "fuzz", "steps": []any{step,
		map[string]any{"name": "after", "handler": "h", "depends_on": []string{"s"}}}})
	return def
}

func checkStepCase(t *testing.T, db *pgtest.DB, presets map[string]preset, c stepCase) {
	t.Helper()
	def := c.definition()
	var bad []string
	nul := bytes.Contains(def, []byte(`\u0000`))
	for _, s := range stepSettings {
		if v, ok := c.set[s.name]; ok && !s.valid(v, presets) {
			bad = append(bad, s.name)
		}
	}

	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	id, err := stepready.CreateTask(ctx, tx, def)
	switch {
	case err != nil && !errors.Is(err, stepready.ErrInvalidDefinition):
		t.Fatalf("CreateTask(%s): not an ErrInvalidDefinition: %v", def, err)
	case err != nil && len(bad) > 0 && !nul:
		msg := err.Error()
		named := slices.ContainsFunc(bad, func(name string) bool { return strings.Contains(msg, name) })
		if !strings.Contains(msg, `steps[0] "s"`) || !named {
			t.Fatalf("CreateTask(%s): the error %q should name step s and one of %v", def, msg, bad)
		}
		return
	case err != nil && len(bad) > 0:
		return
	case err == nil && len(bad) > 0:
		t.Fatalf("CreateTask(%s) accepted invalid %v", def, bad)
	case err != nil:
		// Every setting is valid: only input jsonb cannot hold (invalid UTF-8, a NUL, a number beyond numeric's
		// exponent range), a NUL in a string, or an input reference the database refuses (SPEC §18: the one
		// parser is SQL's, so the oracle asks only that the message names the step's input) can be refused.
		if strings.Contains(err.Error(), `steps[0] "s": input: reference `) {
			return
		}
		if !nul && utf8.Valid(c.input) && !exponent.Match(c.input) {
			t.Fatalf("CreateTask(%s) refused valid settings: %v", def, err)
		}
		return
	}
	checkStored(t, tx, id, presets, c)
}

// exponent matches a JSON number written with an exponent.
var exponent = regexp.MustCompile(`[0-9][eE][+-]?[0-9]`)

// checkStored compares the stored step with what the definition asked for.
func checkStored(t *testing.T, tx pgx.Tx, id int64, presets map[string]preset, c stepCase) {
	t.Helper()
	var got struct {
		preset
		Policy        string
		TimeoutMS     *int64
		BreakerLimit  int64
		OnExhausted   string
		Collect       string
		MaxIterations *int64
		SameInput     bool
	}
	if err := tx.QueryRow(context.Background(), `
		SELECT max_attempts, retryable, backoff, base_delay_ms, multiplier, max_delay_ms, jitter, retry_policy,
		       timeout_ms, breaker_limit, on_exhausted, collect, max_iterations,
		       input = COALESCE(NULLIF($2::jsonb, 'null'::jsonb), '{}'::jsonb)
		  FROM stepready.steps WHERE task_id = $1 AND name = 's'`, id, string(c.input)).Scan(
		&got.MaxAttempts, &got.Retryable, &got.Backoff, &got.BaseDelayMS, &got.Multiplier, &got.MaxDelayMS,
		&got.Jitter, &got.Policy, &got.TimeoutMS, &got.BreakerLimit, &got.OnExhausted, &got.Collect,
		&got.MaxIterations, &got.SameInput); err != nil {
		t.Fatal(err)
	}
	if !got.SameInput {
		t.Errorf("stored input differs from %s", c.input)
	}
	policy := "standard"
	if p, ok := c.set["policy"]; ok {
		policy = p.(string)
	}
	want := presets[policy]
	field := func(name string, dflt any) any {
		if v, ok := c.set[name]; ok {
			return v
		}
		return dflt
	}
	var wantMaxDelay any
	if want.MaxDelayMS != nil {
		wantMaxDelay = *want.MaxDelayMS
	}
	var gotMaxDelay any
	if got.MaxDelayMS != nil {
		gotMaxDelay = *got.MaxDelayMS
	}
	var gotTimeout, gotIterations any
	if got.TimeoutMS != nil {
		gotTimeout = *got.TimeoutMS
	}
	if got.MaxIterations != nil {
		gotIterations = *got.MaxIterations
	}
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"retry_policy", got.Policy, policy},
		{"max_attempts", got.MaxAttempts, field("max_attempts", want.MaxAttempts)},
		{"retryable", got.Retryable, field("retryable", want.Retryable)},
		{"backoff", got.Backoff, field("backoff", want.Backoff)},
		{"base_delay_ms", got.BaseDelayMS, field("base_delay_ms", want.BaseDelayMS)},
		{"multiplier", got.Multiplier, field("multiplier", want.Multiplier)},
		{"max_delay_ms", gotMaxDelay, field("max_delay_ms", wantMaxDelay)},
		{"jitter", got.Jitter, field("jitter", want.Jitter)},
		{"timeout_ms", gotTimeout, field("timeout_ms", nil)},
		{"breaker_limit", got.BreakerLimit, field("breaker_limit", int64(3))},
		{"on_exhausted", got.OnExhausted, field("on_exhausted", "fail_task")},
		{"collect", got.Collect, field("collect", "replace")},
		{"max_iterations", gotIterations, field("max_iterations", nil)},
	} {
		if f.got != f.want {
			t.Errorf("%s: stored %v (%T), want %v (%T)", f.name, f.got, f.got, f.want, f.want)
		}
	}
}

// exampleDefinitions returns every example task definition of the repository (examples/ and
// examples/policies/) as JSON.
func exampleDefinitions(tb testing.TB) []json.RawMessage {
	tb.Helper()
	var files []string
	for _, glob := range []string{"examples/*.yaml", "examples/policies/*.yaml"} {
		m, err := filepath.Glob(glob)
		if err != nil {
			tb.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) == 0 {
		tb.Fatal("no example definitions found")
	}
	var out []json.RawMessage
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			tb.Fatal(err)
		}
		def, err := templates.ParseDefinition(file, data)
		if err != nil {
			tb.Fatalf("%s: %v", file, err)
		}
		out = append(out, def)
	}
	return out
}

// checkCreateTask runs CreateTask in a transaction that is rolled back, and checks its contract.
func checkCreateTask(t *testing.T, db *pgtest.DB, definition []byte) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SAVEPOINT before_create`); err != nil {
		t.Fatal(err)
	}

	id, err := stepready.CreateTask(ctx, tx, definition)
	if err != nil {
		if !errors.Is(err, stepready.ErrInvalidDefinition) {
			t.Fatalf("CreateTask(%q): not an ErrInvalidDefinition: %v", definition, err)
		}
		if err.Error() == stepready.ErrInvalidDefinition.Error() {
			t.Fatalf("CreateTask(%q): the error says nothing more than %q", definition, err)
		}
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT before_create`); err != nil {
			t.Fatal(err)
		}
		var tasks, steps int
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM stepready.tasks), (SELECT count(*) FROM stepready.steps)`).
			Scan(&tasks, &steps); err != nil {
			t.Fatal(err)
		}
		if tasks != 0 || steps != 0 {
			t.Fatalf("CreateTask(%q) failed but %d tasks and %d steps exist", definition, tasks, steps)
		}
		return
	}

	var def struct {
		Steps []struct {
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(definition, &def); err != nil {
		t.Fatalf("CreateTask accepted %q, which Go cannot read as a definition: %v", definition, err)
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE task_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(def.Steps) {
		t.Fatalf("CreateTask(%q): %d step rows, want %d", definition, n, len(def.Steps))
	}
	for _, st := range def.Steps {
		// The stored input is the given one, as jsonb sees it; absent or null is {}.
		var same bool
		if err := tx.QueryRow(ctx, `
			SELECT input = COALESCE(NULLIF($3::jsonb, 'null'::jsonb), '{}'::jsonb)
			  FROM stepready.steps WHERE task_id = $1 AND name = $2`, id, st.Name, nullJSON(st.Input)).Scan(&same); err != nil {
			t.Fatalf("CreateTask(%q): step %q: %v", definition, st.Name, err)
		}
		if !same {
			t.Fatalf("CreateTask(%q): step %q: the stored input differs from %s", definition, st.Name, st.Input)
		}
	}
}

// nullJSON returns v, or the JSON null when v is empty (the field was absent).
func nullJSON(v json.RawMessage) string {
	if len(v) == 0 {
		return "null"
	}
	return string(v)
}
