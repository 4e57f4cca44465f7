package integration

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// stepRowOf is the part of a steps row that a definition decides.
type stepRowOf struct {
	Name          string  `db:"name"`
	Handler       string  `db:"handler"`
	Input         string  `db:"input"`
	State         string  `db:"state"`
	Attempts      int32   `db:"attempts"`
	MaxAttempts   int32   `db:"max_attempts"`
	Retryable     bool    `db:"retryable"`
	Backoff       string  `db:"backoff"`
	BaseDelayMs   int64   `db:"base_delay_ms"`
	Multiplier    float64 `db:"multiplier"`
	MaxDelayMs    *int64  `db:"max_delay_ms"`
	Jitter        float64 `db:"jitter"`
	RetryPolicy   string  `db:"retry_policy"`
	TimeoutMs     *int64  `db:"timeout_ms"`
	OnExhausted   string  `db:"on_exhausted"`
	Rules         *string `db:"rules"`
	Iteration     int32   `db:"iteration"`
	MaxIterations *int32  `db:"max_iterations"`
	Collect       string  `db:"collect"`
	BreakerLimit  int32   `db:"breaker_limit"`
	Priority      int32   `db:"priority"`
	Queue         string  `db:"queue"`
	Pending       int32   `db:"pending_parents"`
}

func (b *schemaBundle) stepRows(taskID int64) map[string]stepRowOf {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(), `
		SELECT name, handler, input::text AS input, state, attempts, max_attempts, retryable, backoff,
		       base_delay_ms, multiplier, max_delay_ms, jitter, retry_policy, timeout_ms, on_exhausted,
		       rules::text AS rules, iteration, max_iterations, collect, breaker_limit, priority, queue,
		       pending_parents
		  FROM stepready.steps WHERE task_id = $1`, taskID)
	require.NoError(b.t, err)
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[stepRowOf])
	require.NoError(b.t, err)
	out := map[string]stepRowOf{}
	for _, r := range list {
		out[r.Name] = r
	}
	return out
}

// edges returns the edges of a task as "parent->child" by step name, sorted.
func (b *schemaBundle) edges(taskID int64) []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(), `
		SELECT p.name || '->' || c.name
		  FROM stepready.step_edges e
		  JOIN stepready.steps p ON p.id = e.parent_step_id
		  JOIN stepready.steps c ON c.id = e.child_step_id
		 WHERE c.task_id = $1 ORDER BY 1`, taskID)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b.t, err)
	return out
}

// taskRowOf is the part of a tasks row that a definition decides.
type taskRowOf struct {
	Name           string  `db:"name"`
	Namespace      string  `db:"namespace"`
	Context        string  `db:"context"`
	Priority       int32   `db:"priority"`
	Status         string  `db:"status"`
	Paused         bool    `db:"paused"`
	Retry          *string `db:"retry"`
	IdempotencyKey *string `db:"idempotency_key"`
}

func (b *schemaBundle) taskRow(taskID int64) taskRowOf {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.t.Context(), `
		SELECT name, namespace, context::text AS context, priority, status, paused, retry::text AS retry,
		       idempotency_key
		  FROM stepready.tasks WHERE id = $1`, taskID)
	require.NoError(b.t, err)
	row, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[taskRowOf])
	require.NoError(b.t, err)
	return row
}

func TestCreateTaskHappyPath(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	taskID := b.createTask(`{
		"name": "etl", "namespace": "billing", "priority": 5, "context": {"customer": 42},
		"steps": [
			{"name": "extract", "handler": "http", "input": {"url": "http://x"}},
			{"name": "transform", "handler": "noop", "depends_on": ["extract"]},
			{"name": "load", "handler": "sql", "depends_on": ["transform", "extract"], "priority": 2,
			 "queue": "db", "timeout_ms": 5000, "on_exhausted": "skip", "max_iterations": 3, "collect": "append",
			 "breaker_limit": 0,
			 "rules": [{"when": "outcome.status == 'ok'", "then": {"do": "break"}}, {"else": {"do": "retry"}}]}
		]}`)

	task := b.taskRow(taskID)
	require.Equal(t, "etl", task.Name)
	require.Equal(t, "billing", task.Namespace)
	require.Equal(t, int32(5), task.Priority)
	require.JSONEq(t, `{"customer": 42}`, task.Context)
	require.Equal(t, "pending", task.Status)
	require.False(t, task.Paused)
	require.Nil(t, task.IdempotencyKey)

	steps := b.stepRows(taskID)
	require.Len(t, steps, 3)
	require.Equal(t, "http", steps["extract"].Handler)
	require.JSONEq(t, `{"url": "http://x"}`, steps["extract"].Input)
	require.JSONEq(t, `{}`, steps["transform"].Input, "input defaults to {}")
	for _, name := range []string{"extract", "transform"} {
		s := steps[name]
		require.Equal(t, "pending", s.State)
		require.Equal(t, int32(0), s.Attempts)
		require.Equal(t, int32(0), s.Iteration)
		require.Equal(t, "fail_task", s.OnExhausted)
		require.Equal(t, "replace", s.Collect)
		require.Equal(t, int32(3), s.BreakerLimit)
		require.Equal(t, int32(0), s.Priority)
		require.Equal(t, "default", s.Queue)
		require.Nil(t, s.TimeoutMs)
		require.Nil(t, s.MaxIterations)
		require.Nil(t, s.Rules)
	}
	load := steps["load"]
	require.Equal(t, int32(2), load.Priority)
	require.Equal(t, "db", load.Queue)
	require.Equal(t, ptr[int64](5000), load.TimeoutMs)
	require.Equal(t, "skip", load.OnExhausted)
	require.Equal(t, ptr[int32](3), load.MaxIterations)
	require.Equal(t, "append", load.Collect)
	require.Equal(t, int32(0), load.BreakerLimit)
	require.NotNil(t, load.Rules)
	require.JSONEq(t, `[{"when": "outcome.status == 'ok'", "then": {"do": "break"}}, {"else": {"do": "retry"}}]`,
		*load.Rules)

	require.Equal(t, []string{"extract->load", "extract->transform", "transform->load"}, b.edges(taskID))
	require.Equal(t, int32(0), steps["extract"].Pending)
	require.Equal(t, int32(1), steps["transform"].Pending)
	require.Equal(t, int32(2), steps["load"].Pending)
	require.Equal(t, int64(3), b.int64(`SELECT steps_total FROM stepready.tasks WHERE id = $1`, taskID))

	ready := b.readinessByName(taskID, testBase)
	require.True(t, ready["extract"].Ready)
	require.False(t, ready["transform"].Ready)
	require.False(t, ready["load"].Ready)
}

func TestCreateTaskDefaults(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	for _, def := range []string{
		`{"name": "bare", "steps": [{"name": "a", "handler": "noop"}]}`,
		`{"name": "nulls", "namespace": null, "context": null, "priority": null, "retry": null,
		  "idempotency_key": null, "steps": [{"name": "a", "handler": "noop", "input": null, "depends_on": null,
		  "retry": null, "timeout_ms": null, "on_exhausted": null, "rules": null, "max_iterations": null,
		  "collect": null, "queue": null, "priority": null, "breaker_limit": null}]}`,
	} {
		taskID := b.createTask(def)
		task := b.taskRow(taskID)
		require.Equal(t, "default", task.Namespace)
		require.JSONEq(t, `{}`, task.Context)
		require.Equal(t, int32(0), task.Priority)
		require.Nil(t, task.IdempotencyKey)
		s := b.stepRows(taskID)["a"]
		require.JSONEq(t, `{}`, s.Input)
		require.Equal(t, "fail_task", s.OnExhausted)
		require.Equal(t, "replace", s.Collect)
		require.Equal(t, int32(3), s.BreakerLimit)
		require.Equal(t, "default", s.Queue)
		require.Equal(t, "standard", s.RetryPolicy)
		require.Equal(t, int32(3), s.MaxAttempts)
	}
}

func TestCreateTaskIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	def := `{"name": "once", "idempotency_key": "order-7", "steps": [
		{"name": "a", "handler": "noop"}, {"name": "b", "handler": "noop", "depends_on": ["a"]}]}`
	first := b.createTask(def)
	require.Equal(t, ptr("order-7"), b.taskRow(first).IdempotencyKey)
	before := b.counts()
	require.Equal(t, rowCounts{Tasks: 1, Steps: 2, Edges: 1, Events: before.Events}, before)

	// The same key returns the existing task and creates nothing, even with another definition.
	require.Equal(t, first, b.createTask(def))
	require.Equal(t, first, b.createTask(`{"name": "other", "idempotency_key": "order-7", "steps": [
		{"name": "x", "handler": "noop"}, {"name": "y", "handler": "noop"}, {"name": "z", "handler": "noop"}]}`))
	require.Equal(t, before, b.counts())
	require.Equal(t, "once", b.taskRow(first).Name)
	require.Len(t, b.stepRows(first), 2)

	// Another key is another task.
	second := b.createTask(strings.Replace(def, "order-7", "order-8", 1))
	require.NotEqual(t, first, second)
	require.Equal(t, before.Tasks+1, b.count("tasks"))
}

// policyField is one materialized policy field with two values that differ from each other and from the
// standard preset's value, so the level that supplied a value can be told from the result.
type policyField struct {
	column  string
	sqlType string
	a, b    any
	std     any
}

var policyFields = []policyField{
	{"max_attempts", "int", 7, 5, 3},
	{"retryable", "bool", false, true, true},
	{"backoff", "text", "linear", "fixed", "exponential"},
	{"base_delay_ms", "bigint", 700, 500, 1000},
	{"multiplier", "float8", 1.5, 3.0, 2.0},
	{"max_delay_ms", "bigint", 7000, 5000, 30000},
	{"jitter", "float8", 0.25, 0.5, 0.0},
}

// The resolution levels of SPEC §3, highest priority first (the standard preset is level 5).
const (
	levelStepColumn = iota + 1
	levelStepPreset
	levelTaskField
	levelTaskPreset
)

var levelNames = map[int]string{
	levelStepColumn: "step column",
	levelStepPreset: "step preset",
	levelTaskField:  "task retry field",
	levelTaskPreset: "task retry.policy preset",
}

// policyCase sets some levels to value "a" or "b" of a field and expects one of a, b or std.
type policyCase struct {
	name   string
	levels map[int]string // level → "a" | "b"
	want   string         // "a" | "b" | "std"
}

func policyCases() []policyCase {
	cases := []policyCase{{name: "nothing set: standard preset", levels: map[int]string{}, want: "std"}}
	for l := levelStepColumn; l <= levelTaskPreset; l++ {
		over := map[int]string{l: "a"}
		for lower := l + 1; lower <= levelTaskPreset; lower++ {
			over[lower] = "b"
		}
		cases = append(cases, policyCase{name: levelNames[l] + " beats every lower level", levels: over, want: "a"})
		if l < levelTaskPreset {
			cases = append(cases, policyCase{name: levelNames[l] + " alone beats standard",
				levels: map[int]string{l: "a"}, want: "a"})
		}
	}
	return append(cases,
		policyCase{name: "explicit step field beats the step preset",
			levels: map[int]string{levelStepColumn: "a", levelStepPreset: "b"}, want: "a"},
		policyCase{name: "explicit task field beats the task preset",
			levels: map[int]string{levelTaskField: "a", levelTaskPreset: "b"}, want: "a"},
		policyCase{name: "step preset beats the task field",
			levels: map[int]string{levelStepPreset: "a", levelTaskField: "b"}, want: "a"},
		policyCase{name: "task field beats a step preset that does not set it",
			levels: map[int]string{levelTaskField: "a"}, want: "a"},
	)
}

// insertPolicyPresets adds, for every policy field, presets p1_<field>_a and p1_<field>_b that set only that
// field (a NULL field of a preset means "not set here").
func (b *schemaBundle) insertPolicyPresets() {
	b.t.Helper()
	for _, f := range policyFields {
		for _, v := range []string{"a", "b"} {
			b.exec(fmt.Sprintf(`INSERT INTO stepready.retry_policies (name, %s) VALUES ($1, $2::%s)`,
				f.column, f.sqlType), "p1_"+f.column+"_"+v, f.value(v))
		}
	}
}

func (f policyField) value(which string) any {
	switch which {
	case "a":
		return f.a
	case "b":
		return f.b
	default:
		return f.std
	}
}

func jsonOf(t testing.TB, v any) string {
	t.Helper()
	out, err := json.Marshal(v)
	require.NoError(t, err)
	return string(out)
}

func TestPolicyResolutionThroughCreateTask(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	b.insertPolicyPresets()

	for _, f := range policyFields {
		for _, c := range policyCases() {
			t.Run(f.column+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				b := b.on(t)
				taskRetry, stepRetry := map[string]any{}, map[string]any{}
				if v, ok := c.levels[levelStepColumn]; ok {
					stepRetry[f.column] = f.value(v)
				}
				if v, ok := c.levels[levelStepPreset]; ok {
					stepRetry["policy"] = "p1_" + f.column + "_" + v
				}
				if v, ok := c.levels[levelTaskField]; ok {
					taskRetry[f.column] = f.value(v)
				}
				if v, ok := c.levels[levelTaskPreset]; ok {
					taskRetry["policy"] = "p1_" + f.column + "_" + v
				}
				def := map[string]any{"name": "policy", "retry": taskRetry,
					"steps": []any{map[string]any{"name": "s", "handler": "noop", "retry": stepRetry}}}
				taskID := b.createTask(jsonOf(t, def))

				var got string
				require.NoError(t, b.db.Pool.QueryRow(t.Context(), fmt.Sprintf(
					`SELECT to_jsonb(%s)::text FROM stepready.steps WHERE task_id = $1`, f.column), taskID).Scan(&got))
				require.JSONEq(t, jsonOf(t, f.value(c.want)), got, "definition %s", jsonOf(t, def))
			})
		}
	}
}

func TestPolicyResolutionThroughPlainInsert(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	b.insertPolicyPresets()

	for _, f := range policyFields {
		for _, c := range policyCases() {
			t.Run(f.column+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				b := b.on(t)
				taskRetry := map[string]any{}
				var column, preset any
				if v, ok := c.levels[levelStepColumn]; ok {
					column = f.value(v)
				}
				if v, ok := c.levels[levelStepPreset]; ok {
					preset = "p1_" + f.column + "_" + v
				}
				if v, ok := c.levels[levelTaskField]; ok {
					taskRetry[f.column] = f.value(v)
				}
				if v, ok := c.levels[levelTaskPreset]; ok {
					taskRetry["policy"] = "p1_" + f.column + "_" + v
				}

				tx, err := b.db.Pool.Begin(t.Context())
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(t.Context()) }()
				var taskID int64
				require.NoError(t, tx.QueryRow(t.Context(),
					`INSERT INTO stepready.tasks (name, retry) VALUES ('policy', $1::jsonb) RETURNING id`,
					jsonOf(t, taskRetry)).Scan(&taskID))
				_, err = tx.Exec(t.Context(), fmt.Sprintf(
					`INSERT INTO stepready.steps (task_id, name, handler, retry_policy, %s)
					 VALUES ($1, 's', 'noop', $2, $3::%s)`, f.column, f.sqlType), taskID, preset, column)
				require.NoError(t, err)
				require.NoError(t, tx.Commit(t.Context()))

				var got string
				require.NoError(t, b.db.Pool.QueryRow(t.Context(), fmt.Sprintf(
					`SELECT to_jsonb(%s)::text FROM stepready.steps WHERE task_id = $1`, f.column), taskID).Scan(&got))
				require.JSONEq(t, jsonOf(t, f.value(c.want)), got)
			})
		}
	}
}

func TestPolicyResolutionRecordsThePreset(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		name, def, want string
	}{
		{"standard by default", `{"name": "p", "steps": [{"name": "s", "handler": "noop"}]}`, "standard"},
		{"the task preset", `{"name": "p", "retry": {"policy": "patient"},
			"steps": [{"name": "s", "handler": "noop"}]}`, "patient"},
		{"the step preset over the task preset", `{"name": "p", "retry": {"policy": "patient"},
			"steps": [{"name": "s", "handler": "noop", "retry": {"policy": "aggressive"}}]}`, "aggressive"},
		{"explicit fields do not change the preset", `{"name": "p", "retry": {"max_attempts": 9},
			"steps": [{"name": "s", "handler": "noop", "retry": {"base_delay_ms": 1}}]}`, "standard"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			require.Equal(t, tt.want, b.stepRows(b.createTask(tt.def))["s"].RetryPolicy)
		})
	}

	// A whole preset, as seeded (SPEC §2), lands on the step.
	t.Run("patient preset values", func(t *testing.T) {
		t.Parallel()
		b := b.on(t)
		s := b.stepRows(b.createTask(`{"name": "p", "steps": [{"name": "s", "handler": "noop",
			"retry": {"policy": "patient"}}]}`))["s"]
		require.Equal(t, stepRowOf{Name: "s", Handler: "noop", Input: "{}", State: "pending", MaxAttempts: 3,
			Retryable: true, Backoff: "exponential", BaseDelayMs: 5000, Multiplier: 3, MaxDelayMs: ptr[int64](90000),
			Jitter: 0, RetryPolicy: "patient", OnExhausted: "fail_task", Collect: "replace", BreakerLimit: 3,
			Queue: "default"}, s)
	})
	t.Run("none preset values", func(t *testing.T) {
		t.Parallel()
		b := b.on(t)
		s := b.stepRows(b.createTask(`{"name": "p", "retry": {"policy": "none"},
			"steps": [{"name": "s", "handler": "noop"}]}`))["s"]
		require.Equal(t, int32(1), s.MaxAttempts)
		require.False(t, s.Retryable)
		require.Equal(t, "fixed", s.Backoff)
		require.Equal(t, int64(0), s.BaseDelayMs)
		require.Equal(t, ptr[int64](0), s.MaxDelayMs)
		require.Equal(t, "none", s.RetryPolicy)
	})
}

func TestPresetEditsAffectOnlyLaterSteps(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	b.exec(`INSERT INTO stepready.retry_policies (name, max_attempts, base_delay_ms) VALUES ('p1_edit', 4, 100)`)

	stepDef := `{"name": "edit", "steps": [{"name": "s", "handler": "noop", "retry": {"policy": "p1_edit"}}]}`
	taskDef := `{"name": "edit", "retry": {"policy": "p1_edit"}, "steps": [{"name": "s", "handler": "noop"}]}`
	plainDef := `{"name": "edit", "steps": [{"name": "s", "handler": "noop"}]}`
	oldStep := b.createTask(stepDef)
	oldTask := b.createTask(taskDef)
	oldPlain := b.createTask(plainDef)

	b.exec(`UPDATE stepready.retry_policies SET max_attempts = 8, base_delay_ms = 800 WHERE name = 'p1_edit'`)
	b.exec(`UPDATE stepready.retry_policies SET max_attempts = 6 WHERE name = 'standard'`)
	newStep := b.createTask(stepDef)
	newTask := b.createTask(taskDef)
	newPlain := b.createTask(plainDef)

	for _, tt := range []struct {
		name     string
		taskID   int64
		attempts int32
		delay    int64
	}{
		{"step preset before the edit", oldStep, 4, 100},
		{"task preset before the edit", oldTask, 4, 100},
		{"standard before the edit", oldPlain, 3, 1000},
		{"step preset after the edit", newStep, 8, 800},
		{"task preset after the edit", newTask, 8, 800},
		{"standard after the edit", newPlain, 6, 1000},
	} {
		s := b.stepRows(tt.taskID)["s"]
		require.Equal(t, tt.attempts, s.MaxAttempts, tt.name)
		require.Equal(t, tt.delay, s.BaseDelayMs, tt.name)
	}
}

func TestCreateTaskValidationErrors(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	const stepA = `{"name": "a", "handler": "noop"}`
	withStep := func(step string) string { return `{"name": "t", "steps": [` + step + `]}` }

	tests := []struct {
		name      string
		def       any // a JSON document, or nil for SQL NULL
		fragments []string
	}{
		{"duplicate step name", `{"name": "t", "steps": [` + stepA + `, ` + stepA + `]}`,
			[]string{`steps[1] "a"`, "name", "duplicate"}},
		{"empty step name", withStep(`{"name": "", "handler": "noop"}`), []string{"steps[0]", "name"}},
		{"missing step name", withStep(`{"handler": "noop"}`), []string{"steps[0]", "name", "required"}},
		{"missing handler", withStep(`{"name": "a"}`), []string{`steps[0] "a"`, "handler"}},
		{"empty handler", withStep(`{"name": "a", "handler": ""}`), []string{`steps[0] "a"`, "handler"}},
		{"unknown dependency", `{"name": "t", "steps": [` + stepA + `, {"name": "b", "handler": "noop",
			"depends_on": ["nope"]}]}`, []string{`steps[1] "b": depends_on: unknown step "nope"`}},
		{"self-dependency", withStep(`{"name": "a", "handler": "noop", "depends_on": ["a"]}`),
			[]string{`steps[0] "a"`, "depends_on"}},
		{"dependency listed twice", `{"name": "t", "steps": [` + stepA + `, {"name": "b", "handler": "noop",
			"depends_on": ["a", "a"]}]}`, []string{`steps[1] "b"`, "depends_on"}},
		{"depends_on not an array", withStep(`{"name": "a", "handler": "noop", "depends_on": "x"}`),
			[]string{`steps[0] "a"`, "depends_on"}},
		{"unknown step preset", withStep(`{"name": "a", "handler": "noop", "retry": {"policy": "nope"}}`),
			[]string{`steps[0] "a"`, "retry.policy", `unknown preset "nope"`}},
		{"unknown task preset", `{"name": "t", "retry": {"policy": "nope"}, "steps": [` + stepA + `]}`,
			[]string{"retry.policy", `unknown preset "nope"`}},
		{"negative task max_attempts", `{"name": "t", "retry": {"max_attempts": -1}, "steps": [` + stepA + `]}`,
			[]string{"retry.max_attempts: must be an integer >= 0"}},
		{"negative step max_attempts", withStep(`{"name": "a", "handler": "noop", "retry": {"max_attempts": -1}}`),
			[]string{`steps[0] "a": retry.max_attempts`}},
		{"fractional max_attempts", withStep(`{"name": "a", "handler": "noop", "retry": {"max_attempts": 1.5}}`),
			[]string{`steps[0] "a": retry.max_attempts`}},
		{"negative base_delay_ms", withStep(`{"name": "a", "handler": "noop", "retry": {"base_delay_ms": -1}}`),
			[]string{`steps[0] "a": retry.base_delay_ms`}},
		{"negative max_delay_ms", `{"name": "t", "retry": {"max_delay_ms": -1}, "steps": [` + stepA + `]}`,
			[]string{"retry.max_delay_ms"}},
		{"negative timeout_ms", withStep(`{"name": "a", "handler": "noop", "timeout_ms": -1}`),
			[]string{`steps[0] "a": timeout_ms`}},
		{"zero timeout_ms", withStep(`{"name": "a", "handler": "noop", "timeout_ms": 0}`),
			[]string{`steps[0] "a": timeout_ms`}},
		{"negative breaker_limit", withStep(`{"name": "a", "handler": "noop", "breaker_limit": -1}`),
			[]string{`steps[0] "a": breaker_limit`}},
		{"max_iterations below 1", withStep(`{"name": "a", "handler": "noop", "max_iterations": 0}`),
			[]string{`steps[0] "a": max_iterations`}},
		{"bad step backoff", withStep(`{"name": "a", "handler": "noop", "retry": {"backoff": "quadratic"}}`),
			[]string{`steps[0] "a": retry.backoff`, `"quadratic"`}},
		{"bad task backoff", `{"name": "t", "retry": {"backoff": "random"}, "steps": [` + stepA + `]}`,
			[]string{"retry.backoff", `"random"`}},
		{"multiplier below 1", withStep(`{"name": "a", "handler": "noop", "retry": {"multiplier": 0.5}}`),
			[]string{`steps[0] "a": retry.multiplier`}},
		{"jitter above 1", withStep(`{"name": "a", "handler": "noop", "retry": {"jitter": 1.5}}`),
			[]string{`steps[0] "a": retry.jitter`}},
		{"negative jitter", `{"name": "t", "retry": {"jitter": -0.1}, "steps": [` + stepA + `]}`,
			[]string{"retry.jitter"}},
		{"retryable not a boolean", withStep(`{"name": "a", "handler": "noop", "retry": {"retryable": "yes"}}`),
			[]string{`steps[0] "a": retry.retryable`}},
		{"bad on_exhausted", withStep(`{"name": "a", "handler": "noop", "on_exhausted": "explode"}`),
			[]string{`steps[0] "a": on_exhausted`}},
		{"bad collect", withStep(`{"name": "a", "handler": "noop", "collect": "sideways"}`),
			[]string{`steps[0] "a": collect`}},
		{"unknown top-level key", `{"name": "t", "nmae": "x", "steps": [` + stepA + `]}`,
			[]string{"definition", `unknown field "nmae"`}},
		{"unknown step key", withStep(`{"name": "a", "handler": "noop", "depends": ["b"]}`),
			[]string{`steps[0] "a"`, `unknown field "depends"`}},
		{"unknown retry key", withStep(`{"name": "a", "handler": "noop", "retry": {"max_attempt": 2}}`),
			[]string{`steps[0] "a": retry`, `unknown field "max_attempt"`}},
		{"rules not an array", withStep(`{"name": "a", "handler": "noop", "rules": {"when": "true"}}`),
			[]string{`steps[0] "a": rules`}},
		{"rule without then", withStep(`{"name": "a", "handler": "noop", "rules": [{"when": "true"}]}`),
			[]string{`steps[0] "a": rules[0]`}},
		{"rule with a bad action", withStep(`{"name": "a", "handler": "noop",
			"rules": [{"when": "true", "then": {"do": "explode"}}]}`), []string{`steps[0] "a": rules[0]`, "do"}},
		{"else not last", withStep(`{"name": "a", "handler": "noop",
			"rules": [{"else": {"do": "fail"}}, {"when": "true", "then": {"do": "retry"}}]}`),
			[]string{`steps[0] "a": rules[0]`, "else"}},
		{"rule not an object", withStep(`{"name": "a", "handler": "noop", "rules": ["true"]}`),
			[]string{`steps[0] "a": rules[0]`}},
		{"empty steps", `{"name": "t", "steps": []}`, []string{"steps", "non-empty"}},
		{"missing steps", `{"name": "t"}`, []string{"steps"}},
		{"step not an object", `{"name": "t", "steps": ["a"]}`, []string{"steps[0]"}},
		{"missing task name", `{"steps": [` + stepA + `]}`, []string{"name", "required"}},
		{"context not an object", `{"name": "t", "context": [1], "steps": [` + stepA + `]}`, []string{"context"}},
		{"priority not an integer", `{"name": "t", "priority": "high", "steps": [` + stepA + `]}`,
			[]string{"priority"}},
		{"definition is an array", `[` + stepA + `]`, []string{"definition", "must be a JSON object"}},
		{"definition is a string", `"t"`, []string{"definition", "must be a JSON object"}},
		{"definition is JSON null", `null`, []string{"definition", "must be a JSON object"}},
		{"definition is SQL NULL", nil, []string{"definition", "must be a JSON object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			err := b.execErr(`SELECT stepready.create_task($1::jsonb)`, tt.def)
			pgErr := requirePgError(t, err, "22023", tt.fragments...)

			// validate_task_definition (used by templates) reports the same problem.
			err = b.execErr(`SELECT stepready.validate_task_definition($1::jsonb)`, tt.def)
			require.Equal(t, pgErr.Message, requirePgError(t, err, "22023").Message)

			// Nothing was written, by this case or any other (every case of this database is an error).
			require.Equal(t, rowCounts{}, b.counts())
		})
	}
}

func TestCreateTaskCycleMessageListsTheCycle(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	// rotations returns every way of writing the cycle names[0] -> … -> names[n-1] -> names[0].
	rotations := func(names ...string) []string {
		var out []string
		for i := range names {
			loop := append(slices.Clone(names[i:]), names[:i]...)
			loop = append(loop, loop[0])
			quoted := make([]string, len(loop))
			for j, n := range loop {
				quoted[j] = `"` + n + `"`
			}
			out = append(out, "dependency cycle "+strings.Join(quoted, " -> "))
		}
		return out
	}

	tests := []struct {
		name  string
		def   string
		valid []string // the message must contain one of these
		not   []string // names that are not on the cycle
	}{
		{"two steps", `{"name": "t", "steps": [
			{"name": "a", "handler": "noop", "depends_on": ["b"]},
			{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`,
			rotations("a", "b"), nil},
		// x → alpha, gamma → alpha → beta → gamma, beta → omega: only alpha, beta, gamma are on the cycle.
		{"three steps behind and before others", `{"name": "t", "steps": [
			{"name": "x", "handler": "noop"},
			{"name": "alpha", "handler": "noop", "depends_on": ["x", "gamma"]},
			{"name": "beta", "handler": "noop", "depends_on": ["alpha"]},
			{"name": "gamma", "handler": "noop", "depends_on": ["beta"]},
			{"name": "omega", "handler": "noop", "depends_on": ["beta"]}]}`,
			rotations("alpha", "beta", "gamma"), []string{`"x"`, `"omega"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			pgErr := requirePgError(t, b.createTaskErr(tt.def), "22023", "depends_on")
			require.Truef(t, slices.ContainsFunc(tt.valid, func(s string) bool {
				return strings.Contains(pgErr.Message, s)
			}), "message %q does not list the cycle as one of %q", pgErr.Message, tt.valid)
			for _, n := range tt.not {
				require.NotContains(t, pgErr.Message, n)
			}
			require.Equal(t, rowCounts{}, b.counts())
		})
	}
}

func TestPlainSQLDefinition(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	ctx := t.Context()

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var taskID int64
	require.NoError(t, tx.QueryRow(ctx, `INSERT INTO stepready.tasks (name, retry)
		VALUES ('plain', '{"policy": "aggressive", "max_attempts": 2}') RETURNING id`).Scan(&taskID))
	ids := map[string]int64{}
	for _, s := range []struct{ name, sql string }{
		{"a", `INSERT INTO stepready.steps (task_id, name, handler) VALUES ($1, 'a', 'noop') RETURNING id`},
		{"b", `INSERT INTO stepready.steps (task_id, name, handler, retry_policy)
		       VALUES ($1, 'b', 'noop', 'patient') RETURNING id`},
		{"c", `INSERT INTO stepready.steps (task_id, name, handler, max_attempts, retryable)
		       VALUES ($1, 'c', 'noop', 1, false) RETURNING id`},
		// An explicit NULL means "not set": defaults and policy are filled as if the column were omitted.
		{"d", `INSERT INTO stepready.steps (task_id, name, handler, input, state, attempts, iteration, on_exhausted,
		           collect, breaker_limit, priority, queue, max_attempts, retryable, backoff, base_delay_ms,
		           multiplier, max_delay_ms, jitter, retry_policy)
		       VALUES ($1, 'd', 'noop', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
		           NULL, NULL, NULL, NULL, NULL) RETURNING id`},
	} {
		var id int64
		require.NoError(t, tx.QueryRow(ctx, s.sql, taskID).Scan(&id), s.name)
		ids[s.name] = id
	}
	for _, e := range [][2]string{{"a", "b"}, {"b", "c"}, {"a", "c"}} {
		_, err := tx.Exec(ctx, `INSERT INTO stepready.step_edges (parent_step_id, child_step_id) VALUES ($1, $2)`,
			ids[e[0]], ids[e[1]])
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))

	steps := b.stepRows(taskID)
	aggressive := stepRowOf{Name: "a", Handler: "noop", Input: "{}", State: "pending", MaxAttempts: 2,
		Retryable: true, Backoff: "exponential", BaseDelayMs: 200, Multiplier: 2, MaxDelayMs: ptr[int64](30000),
		RetryPolicy: "aggressive", OnExhausted: "fail_task", Collect: "replace", BreakerLimit: 3, Queue: "default"}
	require.Equal(t, aggressive, steps["a"], "task retry field over the task preset")

	wantB := aggressive
	wantB.Name, wantB.MaxAttempts, wantB.BaseDelayMs, wantB.Multiplier = "b", 3, 5000, 3
	wantB.MaxDelayMs, wantB.RetryPolicy, wantB.Pending = ptr[int64](90000), "patient", 1
	require.Equal(t, wantB, steps["b"], "step preset over the task level")

	wantC := aggressive
	wantC.Name, wantC.MaxAttempts, wantC.Retryable, wantC.Pending = "c", 1, false, 2
	require.Equal(t, wantC, steps["c"], "step columns over everything")

	wantD := aggressive
	wantD.Name = "d"
	require.Equal(t, wantD, steps["d"], "explicit NULLs are not set")

	require.Equal(t, []string{"a->b", "a->c", "b->c"}, b.edges(taskID))
	require.Equal(t, int64(4), b.int64(`SELECT steps_total FROM stepready.tasks WHERE id = $1`, taskID))
	b.requirePendingParentsInvariant([]int64{taskID}, testBase)
	ready := b.readinessByName(taskID, testBase)
	require.True(t, ready["a"].Ready)
	require.True(t, ready["d"].Ready)
	require.False(t, ready["b"].Ready)
	require.False(t, ready["c"].Ready)
}

func TestPlainSQLBadStepValuesNameTheStep(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		column, value, fragment string
	}{
		{"max_attempts", "-1", "max_attempts"},
		{"base_delay_ms", "-1", "base_delay_ms"},
		{"multiplier", "0.5", "multiplier"},
		{"multiplier", "'Infinity'", "multiplier"},
		{"max_delay_ms", "-1", "max_delay_ms"},
		{"jitter", "1.5", "jitter"},
		{"jitter", "-0.1", "jitter"},
		{"backoff", "'quadratic'", "quadratic"},
		{"timeout_ms", "0", "timeout_ms"},
		{"max_iterations", "0", "max_iterations"},
		{"breaker_limit", "-1", "breaker_limit"},
		{"retry_policy", "'nope'", `unknown preset "nope"`},
		{"handler", "''", "handler"},
		{"on_exhausted", "'explode'", "on_exhausted"},
		{"collect", "'sideways'", "collect"},
		{"state", "'running'", "state"},
	}
	for _, tt := range tests {
		t.Run(tt.column+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			taskID := b.insertTask("bad")
			before := b.count("steps")
			sql := `INSERT INTO stepready.steps (task_id, name, handler, ` + tt.column + `)
			        VALUES ($1, 's', 'noop', ` + tt.value + `)`
			if tt.column == "handler" {
				sql = `INSERT INTO stepready.steps (task_id, name, handler) VALUES ($1, 's', ` + tt.value + `)`
			}
			err := b.execErr(sql, taskID)
			requireOneOfCodes(t, err, []string{"22023", "23514"}, `step "s"`, tt.fragment)
			require.Equal(t, before, b.count("steps"))
		})
	}
}

func TestPlainSQLBadTaskRetryNamesTheTask(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		name, retry string
		fragments   []string
	}{
		{"negative max_attempts", `{"max_attempts": -1}`, []string{"retry.max_attempts"}},
		{"unknown preset", `{"policy": "nope"}`, []string{"retry.policy", `unknown preset "nope"`}},
		{"bad backoff", `{"backoff": "quadratic"}`, []string{"retry.backoff", "quadratic"}},
		{"multiplier below 1", `{"multiplier": 0.9}`, []string{"retry.multiplier"}},
		{"unknown key", `{"bogus": 1}`, []string{"retry", `unknown field "bogus"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			err := b.execErr(`INSERT INTO stepready.tasks (name, retry) VALUES ('badtask', $1::jsonb)`, tt.retry)
			requireOneOfCodes(t, err, []string{"22023", "23514"}, append([]string{`task "badtask"`}, tt.fragments...)...)
			require.Equal(t, int64(0), b.count("tasks"))
		})
	}
}

func TestEdgeTriggerRejectsBadEdges(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	t.Run("across tasks", func(t *testing.T) {
		t.Parallel()
		b := b.on(t)
		left := b.insertStep(b.insertTask("one"), "left")
		right := b.insertStep(b.insertTask("two"), "right")
		err := b.execErr(`INSERT INTO stepready.step_edges VALUES ($1, $2)`, left, right)
		requireOneOfCodes(t, err, []string{"22023", "23514"}, `"left"`, `"right"`)
	})
	t.Run("self-edge", func(t *testing.T) {
		t.Parallel()
		b := b.on(t)
		solo := b.insertStep(b.insertTask("self"), "solo")
		err := b.execErr(`INSERT INTO stepready.step_edges VALUES ($1, $1)`, solo)
		pgErr := requireOneOfCodes(t, err, []string{"22023", "23514"}, `"solo"`)
		require.GreaterOrEqual(t, strings.Count(pgErr.Message, `"solo"`), 2, "names both ends: %s", pgErr.Message)
	})
	for _, tt := range []struct {
		name  string
		chain []string // edges chain[i] -> chain[i+1] are inserted, then the closing edge
	}{
		{"two-step cycle", []string{"alpha", "beta"}},
		{"three-step cycle", []string{"alpha", "beta", "gamma"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			taskID := b.insertTask("cycle")
			ids := map[string]int64{}
			for _, n := range tt.chain {
				ids[n] = b.insertStep(taskID, n)
			}
			for i := 0; i+1 < len(tt.chain); i++ {
				b.insertEdge(ids[tt.chain[i]], ids[tt.chain[i+1]])
			}
			last, first := tt.chain[len(tt.chain)-1], tt.chain[0]
			err := b.execErr(`INSERT INTO stepready.step_edges VALUES ($1, $2)`, ids[last], ids[first])
			requireOneOfCodes(t, err, []string{"22023", "23514"}, `"`+last+`"`, `"`+first+`"`, "cycle")
			require.Len(t, b.edges(taskID), len(tt.chain)-1, "the closing edge is not inserted")
			b.requirePendingParentsInvariant([]int64{taskID}, testBase)
		})
	}
}

func TestTaskTemplates(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	// Versions are inserted out of order; 10 is the newest (numerically, not as text).
	for _, v := range []struct {
		version int
		step    string
	}{{10, "ten"}, {1, "one"}, {2, "two"}} {
		b.exec(`INSERT INTO stepready.task_templates (name, version, definition) VALUES ('etl', $1, $2::jsonb)`,
			v.version, `{"context": {"a": 1, "b": 1}, "steps": [{"name": "`+v.step+`", "handler": "noop"}]}`)
	}
	b.exec(`INSERT INTO stepready.task_templates (name, definition) VALUES ('named', $1::jsonb)`,
		`{"name": "custom", "steps": [{"name": "s", "handler": "noop"}]}`)

	t.Run("newest version and merged context", func(t *testing.T) {
		t.Parallel()
		b := b.on(t)
		taskID := b.int64(`SELECT stepready.create_task_from_template('etl', '{"b": 2, "c": 3}')`)
		task := b.taskRow(taskID)
		require.Equal(t, "etl", task.Name, "the template name names the task")
		require.JSONEq(t, `{"a": 1, "b": 2, "c": 3}`, task.Context, "p_context keys win")
		require.Equal(t, []string{"ten"}, slices.Collect(maps.Keys(b.stepIDs(taskID))))
	})
	t.Run("NULL context keeps the template's", func(t *testing.T) {
		t.Parallel()
		b := b.on(t)
		taskID := b.int64(`SELECT stepready.create_task_from_template('etl', NULL)`)
		require.JSONEq(t, `{"a": 1, "b": 1}`, b.taskRow(taskID).Context)
	})
	t.Run("the definition's own name", func(t *testing.T) {
		t.Parallel()
		b := b.on(t)
		taskID := b.int64(`SELECT stepready.create_task_from_template('named', '{}')`)
		require.Equal(t, "custom", b.taskRow(taskID).Name)
	})
	t.Run("unknown template", func(t *testing.T) {
		t.Parallel()
		b := b.on(t)
		err := b.execErr(`SELECT stepready.create_task_from_template('nope', '{}')`)
		requirePgError(t, err, "P0002", "nope")
	})
}

func TestTaskTemplateIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)
	b.exec(`INSERT INTO stepready.task_templates (name, definition) VALUES ('etl', $1::jsonb)`,
		`{"steps": [{"name": "a", "handler": "noop"}, {"name": "b", "handler": "noop", "depends_on": ["a"]}]}`)

	first := b.int64(`SELECT stepready.create_task_from_template('etl', '{"run": 1}', 'nightly-2030-01-01')`)
	before := b.counts()
	second := b.int64(`SELECT stepready.create_task_from_template('etl', '{"run": 2}', 'nightly-2030-01-01')`)
	require.Equal(t, first, second)
	require.Equal(t, before, b.counts(), "nothing more is created")
	require.JSONEq(t, `{"run": 1}`, b.taskRow(first).Context)
	require.Equal(t, ptr("nightly-2030-01-01"), b.taskRow(first).IdempotencyKey)

	third := b.int64(`SELECT stepready.create_task_from_template('etl', '{"run": 3}', 'nightly-2030-01-02')`)
	require.NotEqual(t, first, third)
}

func TestTaskTemplateValidation(t *testing.T) {
	t.Parallel()
	b := schemaSetup(t)

	tests := []struct {
		name, definition string
		fragments        []string
	}{
		{"empty steps", `{"steps": []}`, []string{"steps"}},
		{"unknown dependency", `{"steps": [{"name": "a", "handler": "noop", "depends_on": ["nope"]}]}`,
			[]string{`steps[0] "a": depends_on: unknown step "nope"`}},
		{"unknown preset", `{"retry": {"policy": "nope"}, "steps": [{"name": "a", "handler": "noop"}]}`,
			[]string{"retry.policy", `"nope"`}},
		{"cycle", `{"steps": [{"name": "a", "handler": "noop", "depends_on": ["b"]},
			{"name": "b", "handler": "noop", "depends_on": ["a"]}]}`, []string{"cycle"}},
		{"unknown key", `{"stesp": [], "steps": [{"name": "a", "handler": "noop"}]}`, []string{`"stesp"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := b.on(t)
			name := "bad_" + strings.ReplaceAll(tt.name, " ", "_")
			err := b.execErr(`INSERT INTO stepready.task_templates (name, definition) VALUES ($1, $2::jsonb)`,
				name, tt.definition)
			requirePgError(t, err, "22023", append([]string{`template "` + name + `"`}, tt.fragments...)...)
			require.Equal(t, int64(0), b.int64(`SELECT count(*) FROM stepready.task_templates WHERE name = $1`, name))
		})
	}
}
