package integration

// Issue 21, SPEC §18: data flows between steps. deps on every row that starts an attempt, references in input
// resolved in SQL at start (typed, in text, with array indexes), a path missing at run time failing the attempt
// deterministic without aborting a batch start, references checked at creation on every path, and the output cap
// kept in the database.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// flowRow is the part of a start_steps / claim_and_start_steps row the data-flow tests look at.
type flowRow struct {
	StepID  int64
	Attempt *int
	Input   *string
	Deps    *string
}

// flowStart runs start_steps for ids at asOf (the steps must be enqueued) and returns its rows by step id.
func (b *lifecycleBundle) flowStart(asOf time.Time, ids ...int64) map[int64]flowRow {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT step_id, attempt, input::text, deps::text
		FROM stepready.start_steps($1, $2, $3, $4)`, ids, testWorker, testLeaseMs, asOf)
	require.NoError(b.t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[flowRow])
	require.NoError(b.t, err)
	out := map[int64]flowRow{}
	for _, r := range got {
		out[r.StepID] = r
	}
	return out
}

// flowClaimStart runs claim_and_start_steps at asOf and returns its rows in order.
func (b *lifecycleBundle) flowClaimStart(limit int, asOf time.Time) []flowRow {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT step_id, attempt, input::text, deps::text
		FROM stepready.claim_and_start_steps($1, $2, $3, $4)`, limit, testWorker, testLeaseMs, asOf)
	require.NoError(b.t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[flowRow])
	require.NoError(b.t, err)
	return got
}

// requireJSON requires got (JSON text) to be the same JSON value as want.
func requireJSON(t testing.TB, want string, got *string, what string) {
	t.Helper()
	require.NotNil(t, got, what)
	require.JSONEq(t, want, *got, what)
}

// TestDepsOnEveryStart: deps holds one member per direct parent that is complete or resolved_manually (named by
// the parent, valued by its output); a skipped parent has none, a grandparent neither; a step without parents
// gets {}. Both start functions return it.
func TestDepsOnEveryStart(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.task(`{"name": "deps", "steps": [
		{"name": "a", "handler": "h"},
		{"name": "r", "handler": "h"},
		{"name": "s", "handler": "h", "on_exhausted": "skip"},
		{"name": "c", "handler": "h", "depends_on": ["a", "r", "s"]},
		{"name": "g", "handler": "h", "depends_on": ["c"]}]}`)
	// A step without parents: {}.
	b.enqueue(ids["a"], t0)
	got := b.flowStart(t0, ids["a"])
	requireJSON(t, `{}`, got[ids["a"]].Deps, "deps of a step without parents")
	require.True(t, b.complete(ids["a"], *got[ids["a"]].Attempt, `{"n": 1, "items": [{"id": 7}]}`, t0))
	b.exec(`SELECT stepready.resolve_step($1, '"by hand"', $2)`, ids["r"], t0)
	attempt := b.run(ids["s"], t0)
	require.Equal(t, "skipped", deref(b.fail(ids["s"], attempt, `{"class": "permanent"}`, t0, 0).State))

	rows := b.flowClaimStart(10, t0)
	require.Len(t, rows, 1)
	require.Equal(t, ids["c"], rows[0].StepID)
	requireJSON(t, `{"a": {"n": 1, "items": [{"id": 7}]}, "r": "by hand"}`, rows[0].Deps,
		"deps: complete and resolved parents, the skipped one absent")
	require.True(t, b.complete(ids["c"], *rows[0].Attempt, `[1, 2]`, t0))

	b.enqueue(ids["g"], t0)
	got = b.flowStart(t0, ids["g"])
	requireJSON(t, `{"c": [1, 2]}`, got[ids["g"]].Deps, "deps: direct parents only")
}

// TestInputReferencesResolved: every resolution rule, each against the same parent output and context.
func TestInputReferencesResolved(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	cases := []struct {
		name  string
		input string
		want  string // with TASK for the task's id
	}{
		{"no reference", `{"a": 1, "s": "plain"}`, `{"a": 1, "s": "plain"}`},
		{"whole output, typed", `{"v": "${deps.p}"}`, `{"v": {"n": 1.5, "ok": true, "none": null, "user": "ann", "items": [{"id": 7}, {"id": 8}], "tags": ["x"]}}`},
		{"array, typed", `{"v": "${deps.p.items}"}`, `{"v": [{"id": 7}, {"id": 8}]}`},
		{"array index", `{"v": "${deps.p.items.1.id}"}`, `{"v": 8}`},
		{"negative index counts from the end", `{"v": "${deps.p.items.-1.id}"}`, `{"v": 8}`},
		{"number, typed", `{"v": "${deps.p.n}"}`, `{"v": 1.5}`},
		{"bool, typed", `{"v": "${deps.p.ok}"}`, `{"v": true}`},
		{"null, typed", `{"v": "${deps.p.none}"}`, `{"v": null}`},
		{"context", `{"v": "${context.region}", "w": "${context}"}`, `{"v": "eu", "w": {"region": "eu", "n": 3}}`},
		{"task id", `{"v": "${task.id}"}`, `{"v": TASK}`},
		{"text", `{"v": "user ${deps.p.user} #${deps.p.items.0.id} in ${context.region}: ${deps.p.ok}/${deps.p.none}"}`,
			`{"v": "user ann #7 in eu: true/null"}`},
		{"text around a task id", `{"v": "task-${task.id}"}`, `{"v": "task-TASK"}`},
		{"nested, in arrays", `{"a": ["${deps.p.n}", {"b": "${context.n}"}, 3], "c": {"d": ["x-${context.region}"]}}`,
			`{"a": [1.5, {"b": 3}, 3], "c": {"d": ["x-eu"]}}`},
		{"input that is one reference", `"${deps.p.tags}"`, `["x"]`},
		{"escape", `{"v": "$${context.region} is ${context.region}"}`, `{"v": "${context.region} is eu"}`},
		{"not a root: plain text", `{"v": "${HOME}/${contextual} ${depsx} $5"}`, `{"v": "${HOME}/${contextual} ${depsx} $5"}`},
		{"keys are not resolved", `{"${context.region}": 1}`, `{"${context.region}": 1}`},
	}
	for _, tc := range cases {
		input, err := json.Marshal(json.RawMessage(tc.input))
		require.NoError(t, err)
		taskID, ids := b.task(fmt.Sprintf(`{"name": "refs", "context": {"region": "eu", "n": 3}, "steps": [
			{"name": "p", "handler": "h"},
			{"name": "c", "handler": "h", "depends_on": ["p"], "input": %s}]}`, input))
		b.runToComplete(ids["p"],
			`{"n": 1.5, "ok": true, "none": null, "user": "ann", "items": [{"id": 7}, {"id": 8}], "tags": ["x"]}`, t0)
		b.enqueue(ids["c"], t0)
		got := b.flowStart(t0, ids["c"])[ids["c"]]
		require.NotNil(t, got.Attempt, tc.name)
		requireJSON(t, strings.ReplaceAll(tc.want, "TASK", fmt.Sprint(taskID)), got.Input, tc.name)
		// The stored input keeps its references.
		require.JSONEq(t, tc.input, b.step(ids["c"]).Input, tc.name)
	}
}

// TestInputReferenceMissingFailsDeterministic: a reference whose path names nothing at start (a missing key, an
// index past the end, a skipped parent, a path through a scalar) or an object inside a longer string fails the
// attempt deterministic naming the reference, and on_exhausted applies; in a batch start the other rows start.
func TestInputReferenceMissingFailsDeterministic(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	cases := []struct {
		name, input, onExhausted, wantState, wantMessage string
	}{
		{"missing key", `{"v": "${deps.p.nope}"}`, "fail_task", "error", "${deps.p.nope}: deps.p.nope not found"},
		{"index past the end", `{"v": "${deps.p.items.5}"}`, "fail_task", "error", "${deps.p.items.5}"},
		{"through a scalar", `{"v": "${deps.p.n.x}"}`, "skip", "skipped", "${deps.p.n.x}"},
		{"skipped parent", `{"v": "${deps.s}"}`, "skip_cascade", "skipped", "${deps.s}: deps.s not found"},
		{"missing context", `{"v": "a ${context.nope} b"}`, "fail_task", "error", "${context.nope}"},
		{"object in a longer string", `{"v": "items: ${deps.p.items}"}`, "fail_task", "error",
			"a reference inside a longer string must name a scalar"},
	}
	for _, tc := range cases {
		input, err := json.Marshal(json.RawMessage(tc.input))
		require.NoError(t, err)
		taskID, ids := b.task(fmt.Sprintf(`{"name": "missing", "steps": [
			{"name": "p", "handler": "h"},
			{"name": "s", "handler": "h", "on_exhausted": "skip"},
			{"name": "ok", "handler": "h", "depends_on": ["p"], "input": {"v": "${deps.p.n}"}},
			{"name": "c", "handler": "h", "depends_on": ["p", "s"], "input": %s, "on_exhausted": %q}]}`,
			input, tc.onExhausted))
		b.runToComplete(ids["p"], `{"n": 1, "items": [{"id": 7}]}`, t0)
		attempt := b.run(ids["s"], t0)
		require.Equal(t, "skipped", deref(b.fail(ids["s"], attempt, `{"class": "permanent"}`, t0, 0).State))

		b.enqueue(ids["ok"], t0)
		b.enqueue(ids["c"], t0)
		got := b.flowStart(t0, ids["ok"], ids["c"])
		require.Len(t, got, 2, tc.name)
		require.NotNil(t, got[ids["ok"]].Attempt, "%s: the other row of the batch starts", tc.name)
		requireJSON(t, `{"v": 1}`, got[ids["ok"]].Input, tc.name)
		require.Nil(t, got[ids["c"]].Attempt, "%s: the row that does not resolve is not handed out", tc.name)

		st := b.step(ids["c"])
		require.Equal(t, tc.wantState, st.State, tc.name)
		require.Equal(t, 1, st.Attempts, "%s: the attempt is charged", tc.name)
		require.NotNil(t, st.LastError, tc.name)
		var lastErr map[string]any
		require.NoError(t, json.Unmarshal([]byte(*st.LastError), &lastErr))
		require.Equal(t, "deterministic", lastErr["class"], tc.name)
		require.Equal(t, "input_reference", lastErr["code"], tc.name)
		require.Contains(t, lastErr["message"], tc.wantMessage, tc.name)
		require.Equal(t, []string{"attempt.started", "attempt.failed", "step.failed"},
			eventNames(b.events(ids["c"]))[:3], tc.name)
		if tc.onExhausted == "fail_task" {
			b.requireStatus(taskID, "error")
		}
	}

	// The same through claim_and_start_steps: the bad row is failed, the good one returned.
	_, ids := b.task(`{"name": "claim", "priority": 5, "steps": [
		{"name": "bad", "handler": "h", "input": {"v": "${context.nope}"}},
		{"name": "good", "handler": "h", "input": {"v": "${task.id}"}}]}`)
	rows := b.flowClaimStart(2, t0)
	require.Len(t, rows, 1)
	require.Equal(t, ids["good"], rows[0].StepID)
	require.Equal(t, "error", b.step(ids["bad"]).State)
}

// TestInputReferencesCheckedAtCreation: a reference to a step that is not a direct parent, a malformed reference
// and ${element}/${index} outside a map step are definition errors naming the step and the reference, through
// create_task, create_tasks, validate_task_definition and templates; nothing is written.
func TestInputReferencesCheckedAtCreation(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	cases := []struct{ name, input, want string }{
		{"not a step", `{"v": "${deps.nope.x}"}`,
			`steps[2] "c": input: reference ${deps.nope.x} names step "nope", which is not a direct parent (depends_on)`},
		{"grandparent", `{"v": "${deps.a}"}`, `steps[2] "c": input: reference ${deps.a} names step "a", which is not a direct parent`},
		{"self", `{"v": "x ${deps.c.y}"}`, `steps[2] "c": input: reference ${deps.c.y} names step "c", which is not a direct parent`},
		{"second reference", `{"v": ["${deps.b}", "${deps.a}"]}`, `steps[2] "c": input: reference ${deps.a} names step "a"`},
		{"unclosed", `{"v": "${deps.b.x"}`, `steps[2] "c": input: reference ${deps.b.x is not closed by }`},
		{"empty segment", `{"v": "${context..x}"}`, `steps[2] "c": input: reference ${context..x}: empty path segment`},
		{"deps without a name", `{"v": "${deps}"}`, `steps[2] "c": input: reference ${deps}: name the parent step`},
		{"task field", `{"v": "${task.name}"}`, `steps[2] "c": input: reference ${task.name}: a task reference is ${task.id}`},
		{"element outside a map", `{"v": "${element.id}"}`, `steps[2] "c": input: reference ${element.id}: only the elements of a map step have ${element} and ${index}`},
		{"index outside a map", `{"v": "${index}"}`, `steps[2] "c": input: reference ${index}: only the elements of a map step have ${element} and ${index}`},
	}
	for _, tc := range cases {
		input, err := json.Marshal(json.RawMessage(tc.input))
		require.NoError(t, err)
		def := fmt.Sprintf(`{"name": "bad", "steps": [{"name": "a", "handler": "h"},
			{"name": "b", "handler": "h", "depends_on": ["a"]},
			{"name": "c", "handler": "h", "depends_on": ["b"], "input": %s}]}`, input)
		requireSQLState(t, b.callErr(`SELECT stepready.create_task($1::jsonb)`, def), "22023", tc.want)
		requireSQLState(t, b.callErr(`SELECT * FROM stepready.create_tasks($1::jsonb)`, `[{"name": "ok", "steps": [{"name": "x", "handler": "h"}]}, `+def+`]`),
			"22023", "definitions[1]: "+tc.want)
		requireSQLState(t, b.callErr(`SELECT stepready.validate_task_definition($1::jsonb)`, def), "22023", tc.want)
		requireSQLState(t, b.callErr(`INSERT INTO stepready.task_templates (name, version, definition) VALUES ('t', 1, $1::jsonb)`, def),
			"22023", tc.want)
	}
	require.Zero(t, b.intCall(`SELECT count(*) FROM stepready.tasks`), "nothing written")

	// Valid references are accepted on every path.
	good := `{"name": "good", "context": {"k": 1}, "steps": [{"name": "a", "handler": "h"},
		{"name": "b", "handler": "h", "depends_on": ["a"], "input": {"v": "${deps.a.x}", "w": "${context.k} ${task.id} $${deps.zz}", "h": "${HOME}"}}]}`
	b.task(good)
	b.exec(`SELECT * FROM stepready.create_tasks(jsonb_build_array($1::jsonb))`, good)
	b.exec(`INSERT INTO stepready.task_templates (name, version, definition) VALUES ('good', 1, $1::jsonb)`, good)
}

// TestInputReferencesPlainSQL: the plain-SQL path checks references when the transaction commits (edges come after
// the steps): a reference to a direct parent commits, one to a step that is not a parent fails the commit naming
// the step and the reference, and nothing of the transaction is written.
func TestInputReferencesPlainSQL(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	insert := func(ref string, edge bool) error {
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		var taskID, a, c int64
		require.NoError(t, tx.QueryRow(b.ctx, `INSERT INTO stepready.tasks (name) VALUES ('plain') RETURNING id`).Scan(&taskID))
		require.NoError(t, tx.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, handler) VALUES ($1, 'a', 'h') RETURNING id`, taskID).Scan(&a))
		require.NoError(t, tx.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, handler, input)
			VALUES ($1, 'c', 'h', jsonb_build_object('v', $2::text)) RETURNING id`, taskID, ref).Scan(&c))
		if edge {
			if _, err := tx.Exec(b.ctx, `INSERT INTO stepready.step_edges (parent_step_id, child_step_id) VALUES ($1, $2)`, a, c); err != nil {
				return err
			}
		}
		return tx.Commit(b.ctx)
	}
	require.NoError(t, insert("${deps.a.x}", true), "a direct parent, its edge inserted after the step")
	requireSQLState(t, insert("${deps.a.x}", false), "22023", `"c": input: reference ${deps.a.x} names step "a", which is not a direct parent`)
	requireSQLState(t, insert("${deps.a", true), "22023", `"c": input: reference ${deps.a is not closed by }`)
	require.NoError(t, insert("${HOME}", false), "not a reference")
	require.Equal(t, 2, b.intCall(`SELECT count(*) FROM stepready.tasks`), "the refused transactions wrote nothing")
}

// TestOutputCap: complete_step, complete_steps, continue_step and resolve_step refuse an output over
// settings.max_output_bytes (SQLSTATE 54000, naming the step, the size and the limit) and accept one at it.
func TestOutputCap(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	var def int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT (value #>> '{}')::bigint FROM stepready.settings WHERE name = 'max_output_bytes'`).Scan(&def))
	require.Equal(t, int64(1<<20), def, "default: 1 MiB")
	big := fmt.Sprintf(`"%s"`, strings.Repeat("x", 1<<20)) // 1 MiB + 2 bytes of JSON text
	_, s := b.oneStep("")
	attempt := b.run(s, t0)
	requireSQLState(t, b.callErr(`SELECT stepready.complete_step($1, $2, $3::jsonb, $4)`, s, attempt, big, t0), "54000",
		fmt.Sprintf("step %d: output is 1048578 bytes, over the limit of 1048576 bytes", s))

	b.exec(`UPDATE stepready.settings SET value = '20' WHERE name = 'max_output_bytes'`)
	at := `{"k": "0123456789"}` // 19 bytes as jsonb text: {"k": "0123456789"}
	require.Len(t, at, 19)
	over := `{"k": "01234567890a"}`
	requireSQLState(t, b.callErr(`SELECT stepready.complete_step($1, $2, $3::jsonb, $4)`, s, attempt, over, t0), "54000",
		"over the limit of 20 bytes")
	requireSQLState(t, b.callErr(`SELECT * FROM stepready.complete_steps(ARRAY[$1::bigint], ARRAY[$2::int], ARRAY[$3::jsonb], $4)`,
		s, attempt, over, t0), "54000", fmt.Sprintf("step %d: output is 21 bytes", s))
	requireSQLState(t, b.callErr(`SELECT stepready.continue_step($1, $2, $3::jsonb, NULL, 0, $4)`, s, attempt, over, t0),
		"54000", "over the limit of 20 bytes")
	requireSQLState(t, b.callErr(`SELECT stepready.resolve_step($1, $2::jsonb, $3)`, s, over, t0), "54000",
		"over the limit of 20 bytes")
	require.Equal(t, "in_progress", b.step(s).State, "nothing recorded")
	require.True(t, b.complete(s, attempt, at, t0), "an output at the limit")

	// The limit is bounded by the table.
	requireSQLState(t, b.callErr(`UPDATE stepready.settings SET value = '0' WHERE name = 'max_output_bytes'`), "23514")
	requireSQLState(t, b.callErr(`INSERT INTO stepready.settings VALUES ('nope', '1')`), "23514")
}

// TestResolveInputElement: the resolver already handles a map element's ${element}, ${element.PATH} and ${index}
// (SPEC §19; map steps themselves are not built yet), and leaves them unresolvable for a step that is not an
// element.
func TestResolveInputElement(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	var value, problem *string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT r.value::text, r.problem FROM stepready._resolve_input(
		'{"file": "${element.name}", "n": "${index}", "whole": "${element}", "label": "#${index}: ${element.name}"}',
		'{}', '{}', 9, '{"name": "a.csv", "size": 3}', 4) r`).Scan(&value, &problem))
	require.Nil(t, problem)
	requireJSON(t, `{"file": "a.csv", "n": 4, "whole": {"name": "a.csv", "size": 3}, "label": "#4: a.csv"}`, value, "element")
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT r.value::text, r.problem FROM stepready._resolve_input(
		'{"n": "${index}"}', '{}', '{}', 9) r`).Scan(&value, &problem))
	require.Nil(t, value)
	require.Equal(t, "input reference ${index}: index not found", deref(problem))
}
