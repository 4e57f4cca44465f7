package integration

// Issue 21 part 2, SPEC §19: map steps. A map step fans out into one element per item of `over` when a claim
// picks it; elements are steps (claimed, started, completed like any), their input sees ${element…} and
// ${index}; the map step's output is the elements' outputs in element order; an empty array completes at once
// with []; a value that is not an array, or longer than max_elements, fails the map step deterministic.

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// mapRow is the part of a claim_and_start_steps row the map tests look at.
type mapRow struct {
	StepID  int64
	Name    string
	Attempt int
	Input   string
	Deps    string
	Element *string
	Index   *int
}

// mapClaimStart runs claim_and_start_steps at asOf and returns its rows in order.
func (b *lifecycleBundle) mapClaimStart(limit int, asOf time.Time) []mapRow {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT step_id, name, attempt, input::text, deps::text, element::text,
		element_index FROM stepready.claim_and_start_steps($1, $2, $3, $4)`, limit, testWorker, testLeaseMs, asOf)
	require.NoError(b.t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[mapRow])
	require.NoError(b.t, err)
	return got
}

// mapTask creates list → m → join, makes m a map step over `over` (plain SQL: the definition path comes in a
// later layer) with input, runs list to complete with listOutput, and returns the ids.
func (b *lifecycleBundle) mapTask(mapDef, input, listOutput string, t0 time.Time) (int64, map[string]int64) {
	b.t.Helper()
	taskID, ids := b.task(`{"name": "fan", "steps": [
		{"name": "list", "handler": "h"},
		{"name": "m", "handler": "work", "depends_on": ["list"]},
		{"name": "join", "handler": "h", "depends_on": ["m"]}]}`)
	b.exec(`UPDATE stepready.steps SET map = $2::jsonb, input = $3::jsonb WHERE id = $1`, ids["m"], mapDef, input)
	rows := b.mapClaimStart(10, t0)
	require.Len(b.t, rows, 1)
	require.Equal(b.t, ids["list"], rows[0].StepID)
	require.True(b.t, b.complete(ids["list"], rows[0].Attempt, listOutput, t0))
	return taskID, ids
}

func TestMapFanOutAndAggregateInElementOrder(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	taskID, ids := b.mapTask(`{"over": "${deps.list.items}"}`,
		`{"v": "${element.v}", "i": "${index}", "all": "${element}", "text": "item ${index} of ${task.id}"}`,
		`{"items": [{"v": "a"}, {"v": "b"}, {"v": "c"}]}`, t0)

	// The claim that picks the map step fans it out and hands nothing over.
	require.Empty(t, b.mapClaimStart(10, t0))
	m := b.step(ids["m"])
	require.Equal(t, "in_progress", m.State)
	require.Nil(t, m.LeaseOwner, "a map step has no lease")
	var total, done int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT map_total, map_done FROM stepready.steps WHERE id = $1`,
		ids["m"]).Scan(&total, &done))
	require.Equal(t, 3, total)
	require.Equal(t, 0, done)
	var stepsTotal int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT steps_total FROM stepready.tasks WHERE id = $1`, taskID).
		Scan(&stepsTotal))
	require.Equal(t, 3, stepsTotal, "elements are not counted in their task")

	rows := b.mapClaimStart(10, t0)
	require.Len(t, rows, 3)
	for i, r := range rows {
		require.Equal(t, "m["+string(rune('0'+i))+"]", r.Name)
		require.NotNil(t, r.Index)
		require.Equal(t, i, *r.Index)
		v := string(rune('a' + i))
		requireJSON(t, `{"v": "`+v+`"}`, r.Element, "element")
		requireJSON(t, `{"v": "`+v+`", "i": `+string(rune('0'+i))+`, "all": {"v": "`+v+`"}, "text": "item `+
			string(rune('0'+i))+` of `+itoa(taskID)+`"}`, &r.Input, "resolved input")
		requireJSON(t, `{"list": {"items": [{"v": "a"}, {"v": "b"}, {"v": "c"}]}}`, &r.Deps,
			"an element's deps are its map step's")
	}
	// Completed in reverse order: the output is still in element order, written once, by the last one.
	for i := 2; i >= 0; i-- {
		require.True(t, b.complete(rows[i].StepID, rows[i].Attempt, `{"out": `+string(rune('0'+i))+`}`, t0))
		if i > 0 {
			b.requireState(ids["m"], "in_progress")
		}
	}
	b.requireState(ids["m"], "complete")
	requireJSON(t, `[{"out": 0}, {"out": 1}, {"out": 2}]`, b.step(ids["m"]).Output, "output in element order")

	rows = b.mapClaimStart(10, t0)
	require.Len(t, rows, 1)
	require.Equal(t, ids["join"], rows[0].StepID)
	requireJSON(t, `{"m": [{"out": 0}, {"out": 1}, {"out": 2}]}`, &rows[0].Deps, "the join reads the aggregate")
	require.Nil(t, rows[0].Element)
	require.True(t, b.complete(ids["join"], rows[0].Attempt, `{}`, t0))
	b.requireStatus(taskID, "complete")
}

func TestMapEmptyArrayCompletesAtOnce(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.mapTask(`{"over": "${deps.list.items}"}`, `{}`, `{"items": []}`, t0)
	require.Empty(t, b.mapClaimStart(10, t0))
	b.requireState(ids["m"], "complete")
	requireJSON(t, `[]`, b.step(ids["m"]).Output, "an empty map's output")
	rows := b.mapClaimStart(10, t0)
	require.Len(t, rows, 1)
	require.Equal(t, ids["join"], rows[0].StepID)
}

func TestMapOverLiteralArray(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.mapTask(`{"over": [10, 20]}`, `{"n": "${element}"}`, `{}`, t0)
	require.Empty(t, b.mapClaimStart(10, t0))
	rows := b.mapClaimStart(10, t0)
	require.Len(t, rows, 2)
	requireJSON(t, `{"n": 10}`, &rows[0].Input, "literal over")
	requireJSON(t, `{"n": 20}`, &rows[1].Input, "literal over")
	require.True(t, b.complete(rows[0].StepID, rows[0].Attempt, `1`, t0))
	require.True(t, b.complete(rows[1].StepID, rows[1].Attempt, `2`, t0))
	requireJSON(t, `[1, 2]`, b.step(ids["m"]).Output, "output")
}

func TestMapOverNotAnArrayOrTooLongFailsDeterministic(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, mapDef, list, want string }{
		{"object", `{"over": "${deps.list.items}"}`, `{"items": {"a": 1}}`,
			`map.over ${deps.list.items}: is object, not an array`},
		{"number", `{"over": "${deps.list.n}"}`, `{"n": 5}`, `map.over ${deps.list.n}: is number, not an array`},
		{"missing", `{"over": "${deps.list.nope}"}`, `{"n": 5}`, `map.over ${deps.list.nope}: input reference ${deps.list.nope}: deps.list.nope not found`},
		{"too long", `{"over": "${deps.list.items}", "max_elements": 2}`, `{"items": [1, 2, 3]}`,
			`map.over ${deps.list.items}: has 3 elements, more than max_elements (2)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			t0 := testBase
			taskID, ids := b.mapTask(c.mapDef, `{}`, c.list, t0)
			require.Empty(t, b.mapClaimStart(10, t0))
			m := b.step(ids["m"])
			require.Equal(t, "error", m.State)
			require.NotNil(t, m.LastError)
			var lastErr struct{ Class, Message string }
			require.NoError(t, json.Unmarshal([]byte(*m.LastError), &lastErr))
			require.Equal(t, "deterministic", lastErr.Class)
			require.Contains(t, lastErr.Message, c.want)
			var n int
			require.NoError(t, b.db.Pool.QueryRow(b.ctx,
				`SELECT count(*) FROM stepready.steps WHERE map_step_id = $1`, ids["m"]).Scan(&n))
			require.Zero(t, n, "no element written")
			b.requireStatus(taskID, "error")
		})
	}
}

func TestMapElementInErrorEndsTheMap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ onExhausted, mapState, taskStatus, joinState string }{
		{"fail_task", "error", "error", "pending"},
		{"skip", "skipped", "in_progress", ""},
		{"skip_cascade", "skipped", "complete", "skipped"},
	} {
		t.Run(c.onExhausted, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			t0 := testBase
			taskID, ids := b.mapTask(`{"over": [1, 2, 3, 4]}`, `{}`, `{}`, t0)
			b.exec(`UPDATE stepready.steps SET on_exhausted = $2 WHERE id = $1`, ids["m"], c.onExhausted)
			require.Empty(t, b.mapClaimStart(10, t0))
			rows := b.mapClaimStart(2, t0) // elements 0 and 1 in flight; 2 and 3 ready
			require.Len(t, rows, 2)
			require.True(t, b.complete(rows[0].StepID, rows[0].Attempt, `"ok"`, t0))
			res := b.fail(rows[1].StepID, rows[1].Attempt, `{"class": "permanent", "message": "bad item"}`, t0, 0)
			require.Equal(t, "error", deref(res.State))

			m := b.step(ids["m"])
			require.Equal(t, c.mapState, m.State)
			require.NotNil(t, m.LastError)
			var lastErr struct{ Class, Message string }
			require.NoError(t, json.Unmarshal([]byte(*m.LastError), &lastErr))
			require.Equal(t, "permanent", lastErr.Class)
			require.Equal(t, `element 1 ("m[1]") failed: bad item`, lastErr.Message)
			var states []string
			require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT array_agg(state ORDER BY element_index)
				FROM stepready.steps WHERE map_step_id = $1`, ids["m"]).Scan(&states))
			require.Equal(t, []string{"complete", "error", "cancelled", "cancelled"}, states,
				"the map's other elements start no more")
			b.requireStatus(taskID, c.taskStatus)
			if c.joinState != "" {
				b.requireState(ids["join"], c.joinState)
			}
		})
	}
}

func TestMapThroughTheDefinition(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.task(`{"name": "fan", "steps": [
		{"name": "list", "handler": "h"},
		{"name": "m", "handler": "work", "depends_on": ["list"], "input": {"x": "${element.x}", "i": "${index}"},
		 "map": {"over": "${deps.list}", "max_elements": 5}}]}`)
	rows := b.mapClaimStart(10, t0)
	require.Len(t, rows, 1)
	require.True(t, b.complete(ids["list"], rows[0].Attempt, `[{"x": 1}, {"x": 2}]`, t0))
	require.Empty(t, b.mapClaimStart(10, t0))
	rows = b.mapClaimStart(10, t0)
	require.Len(t, rows, 2)
	requireJSON(t, `{"x": 2, "i": 1}`, &rows[1].Input, "element input")

	for _, c := range []struct{ mapDef, want string }{
		{`[1]`, `"m": map: must be an object`},
		{`{}`, `"m": map.over: is required`},
		{`{"over": 5}`, `"m": map.over: must be an array or one reference`},
		{`{"over": "a ${deps.list}"}`, `"m": map.over: must be an array or exactly one reference`},
		{`{"over": "${deps.other}"}`, `which is not a direct parent`},
		{`{"over": "${task.id}"}`, `over reads deps or context`},
		{`{"over": [], "max_in_flight": 0}`, `map.max_in_flight: `},
		{`{"over": [], "max_elements": 100001}`, `map.max_elements: `},
		{`{"over": [1, 2], "max_elements": 1}`, `map.over: has 2 elements, more than max_elements (1)`},
		{`{"over": [], "size": 1}`, `"m": map: `},
	} {
		_, err := b.db.Pool.Exec(b.ctx, `SELECT stepready.create_task($1::jsonb)`, `{"name": "bad", "steps": [
			{"name": "list", "handler": "h"}, {"name": "other", "handler": "h"},
			{"name": "m", "handler": "h", "depends_on": ["list"], "map": `+c.mapDef+`}]}`)
		require.Error(t, err, c.mapDef)
		require.Contains(t, err.Error(), c.want, c.mapDef)
	}
	// ${element} outside a map step is still refused.
	_, err := b.db.Pool.Exec(b.ctx, `SELECT stepready.create_task($1::jsonb)`, `{"name": "bad", "steps": [
		{"name": "m", "handler": "h", "input": {"x": "${element}"}}]}`)
	require.ErrorContains(t, err, "only the elements of a map step")
}

// mapStates returns the states of map step m's elements in element order, a held element (outside the window)
// as "held".
func (b *lifecycleBundle) mapStates(m int64) []string {
	b.t.Helper()
	var states []string
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT array_agg(CASE WHEN pending_parents > 0 THEN 'held'
		ELSE state END ORDER BY element_index) FROM stepready.steps WHERE map_step_id = $1`, m).Scan(&states))
	return states
}

func TestMapMaxInFlightWindow(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.mapTask(`{"over": [0, 1, 2, 3, 4], "max_in_flight": 2}`, `{"n": "${element}"}`, `{}`, t0)
	b.exec(`UPDATE stepready.steps SET max_attempts = 2, backoff = 'fixed', base_delay_ms = 60000, jitter = 0
		WHERE id = $1`, ids["m"])
	require.Empty(t, b.mapClaimStart(10, t0))
	require.Equal(t, []string{"pending", "pending", "held", "held", "held"}, b.mapStates(ids["m"]))
	rows := b.mapClaimStart(10, t0)
	require.Len(t, rows, 2, "no more than max_in_flight")
	require.Empty(t, b.mapClaimStart(10, t0))
	// Seen: the held elements' reason, the map step's progress.
	var reason, message string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT r.blocked_reason, (SELECT e.message
		FROM stepready.explain_step(r.step_id, $2) e LIMIT 1)
		FROM stepready.step_readiness(ARRAY[(SELECT task_id FROM stepready.steps WHERE id = $1)], NULL, $2) r
		WHERE r.name = 'm[2]'`, ids["m"], t0).Scan(&reason, &message))
	require.Equal(t, "map_window", reason)
	require.Equal(t, "waiting for a slot of map step `m`: 2 of 2 in flight", message)
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT message FROM stepready.explain_step($1, $2) LIMIT 1`,
		ids["m"], t0).Scan(&message))
	require.Equal(t, "mapping: 0 of 5 elements complete, 2 in flight, 0 waiting for retry, 0 failed", message)

	// One completes: one slot, the next element in order.
	require.True(t, b.complete(rows[0].StepID, rows[0].Attempt, `0`, t0))
	require.Equal(t, []string{"complete", "in_progress", "pending", "held", "held"}, b.mapStates(ids["m"]))
	// One in backoff keeps its slot.
	require.Equal(t, "waiting_for_retry", deref(b.fail(rows[1].StepID, rows[1].Attempt,
		`{"class": "transient"}`, t0, 0).State))
	rows2 := b.mapClaimStart(10, t0)
	require.Len(t, rows2, 1)
	require.Equal(t, 2, *rows2[0].Index)
	require.Empty(t, b.mapClaimStart(10, t0))
	require.True(t, b.complete(rows2[0].StepID, rows2[0].Attempt, `2`, t0))
	require.Equal(t, []string{"complete", "waiting_for_retry", "complete", "pending", "held"}, b.mapStates(ids["m"]))

	// The retry comes due: it and element 3 run; then the rest.
	t1 := t0.Add(time.Minute)
	rows3 := b.mapClaimStart(10, t1)
	require.Len(t, rows3, 2)
	for _, r := range rows3 {
		require.True(t, b.complete(r.StepID, r.Attempt, itoa(int64(*r.Index)), t1))
	}
	rows4 := b.mapClaimStart(10, t1)
	require.Len(t, rows4, 1)
	require.True(t, b.complete(rows4[0].StepID, rows4[0].Attempt, `4`, t1))
	b.requireState(ids["m"], "complete")
	requireJSON(t, `[0, 1, 2, 3, 4]`, b.step(ids["m"]).Output, "output in element order")
}

// mapFailOne fans out map step m over four elements with a window of 2, completes element 0 and fails element 1
// permanently (which ends the map); it returns the elements' ids in element order.
func (b *lifecycleBundle) mapFailOne(ids map[string]int64, t0 time.Time) []int64 {
	b.t.Helper()
	require.Empty(b.t, b.mapClaimStart(10, t0))
	rows := b.mapClaimStart(10, t0)
	require.Len(b.t, rows, 2)
	require.True(b.t, b.complete(rows[0].StepID, rows[0].Attempt, `"ok 0"`, t0))
	require.Equal(b.t, "error", deref(b.fail(rows[1].StepID, rows[1].Attempt, `{"class": "permanent"}`, t0, 0).State))
	b.requireState(ids["m"], "error")
	require.Equal(b.t, []string{"complete", "error", "cancelled", "cancelled"}, b.mapStates(ids["m"]))
	var els []int64
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT array_agg(id ORDER BY element_index) FROM stepready.steps
		WHERE map_step_id = $1`, ids["m"]).Scan(&els))
	return els
}

// mapFinish runs the map's remaining elements to completion (output "ok I") and requires the map complete with
// every output in element order.
func (b *lifecycleBundle) mapFinish(ids map[string]int64, asOf time.Time) {
	b.t.Helper()
	for i := 0; i < 10 && b.step(ids["m"]).State != "complete"; i++ {
		rows := b.mapClaimStart(10, asOf)
		require.NotEmpty(b.t, rows, "elements left: %v", b.mapStates(ids["m"]))
		require.LessOrEqual(b.t, len(rows), 2, "the window holds after a retry")
		for _, r := range rows {
			require.NotNil(b.t, r.Index, "only elements before the map completes: %+v", r)
			require.True(b.t, b.complete(r.StepID, r.Attempt, `"ok `+itoa(int64(*r.Index))+`"`, asOf))
		}
	}
	b.requireState(ids["m"], "complete")
	requireJSON(b.t, `["ok 0", "ok 1", "ok 2", "ok 3"]`, b.step(ids["m"]).Output, "output in element order")
}

func TestMapRetryStepNowRetriesFailedElements(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	taskID, ids := b.mapTask(`{"over": [0, 1, 2, 3], "max_in_flight": 2}`, `{}`, `{}`, t0)
	els := b.mapFailOne(ids, t0)
	b.requireStatus(taskID, "error")

	b.exec(`SELECT stepready.retry_step_now($1, $2)`, ids["m"], t0)
	b.requireState(ids["m"], "in_progress")
	require.Equal(t, []string{"complete", "waiting_for_retry", "pending", "held"}, b.mapStates(ids["m"]),
		"the failed element and the cancelled ones come back, in the window")
	require.Equal(t, 2, b.step(els[1]).MaxAttempts, "one more attempt for the failed element")
	b.requireStatus(taskID, "in_progress")
	b.mapFinish(ids, t0)
	var total, done, failed int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT map_total, map_done, map_failed FROM stepready.steps
		WHERE id = $1`, ids["m"]).Scan(&total, &done, &failed))
	require.Equal(t, []int{4, 4, 0}, []int{total, done, failed})
}

func TestMapResetTaskResetsElements(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	taskID, ids := b.mapTask(`{"over": [0, 1, 2, 3], "max_in_flight": 2}`, `{}`, `{}`, t0)
	els := b.mapFailOne(ids, t0)

	var k int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.reset_task($1, $2)`, taskID, t0).Scan(&k))
	require.Equal(t, 1, k, "the map step counts as one step reset")
	b.requireState(ids["m"], "in_progress")
	require.Equal(t, []string{"complete", "pending", "pending", "held"}, b.mapStates(ids["m"]))
	require.Equal(t, 0, b.step(els[1]).Attempts, "back to its first attempt")
	requireJSON(t, `"ok 0"`, b.step(els[0]).Output, "a completed element keeps its output")
	b.requireStatus(taskID, "in_progress")
	b.mapFinish(ids, t0)
}

func TestMapResolveStepCancelsItsElements(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	taskID, ids := b.mapTask(`{"over": [0, 1, 2, 3], "max_in_flight": 2}`, `{}`, `{}`, t0)
	require.Empty(t, b.mapClaimStart(10, t0))
	rows := b.mapClaimStart(10, t0)
	require.Len(t, rows, 2)
	require.True(t, b.complete(rows[0].StepID, rows[0].Attempt, `0`, t0))
	b.exec(`SELECT stepready.resolve_step($1, '["by hand"]', $2)`, ids["m"], t0)
	require.Equal(t, []string{"complete", "cancelled", "cancelled", "cancelled"}, b.mapStates(ids["m"]))
	require.NotNil(t, b.step(rows[1].StepID).LeaseOwner, "the element in flight keeps its lease, orphaned")
	// Its late completion changes nothing.
	require.False(t, b.complete(rows[1].StepID, rows[1].Attempt, `1`, t0))
	requireJSON(t, `["by hand"]`, b.step(ids["m"]).Output, "the operator's output")
	rows = b.mapClaimStart(10, t0)
	require.Len(t, rows, 1)
	require.Equal(t, ids["join"], rows[0].StepID)
	require.True(t, b.complete(ids["join"], rows[0].Attempt, `{}`, t0))
	b.requireStatus(taskID, "complete")
}

// TestMapFansOut100000ElementsInOneStatement: the largest map (max_elements 100,000) fans out in the claim that
// picks it, with one INSERT, and claiming from it reads the claim index like any ready steps.
func TestMapFansOut100000ElementsInOneStatement(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 rows")
	}
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.task(`{"name": "big", "context": {"n": 100000}, "steps": [
		{"name": "m", "handler": "work", "input": {"i": "${index}"},
		 "map": {"over": "${context.items}", "max_elements": 100000}}]}`)
	b.exec(`UPDATE stepready.tasks SET context = jsonb_build_object('items',
		(SELECT jsonb_agg(g) FROM generate_series(1, 100000) g)) WHERE id = (SELECT task_id FROM stepready.steps
		WHERE id = $1)`, ids["m"])
	start := time.Now()
	require.Empty(t, b.mapClaimStart(10, t0))
	fanOut := time.Since(start)
	var total, n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT map_total, (SELECT count(*) FROM stepready.steps
		WHERE map_step_id = $1) FROM stepready.steps WHERE id = $1`, ids["m"]).Scan(&total, &n))
	require.Equal(t, 100000, total)
	require.Equal(t, 100000, n)
	// Every started row carries its task's context, as for any step: 600 kB of items would be the measure here.
	b.exec(`UPDATE stepready.tasks SET context = '{}' WHERE id = (SELECT task_id FROM stepready.steps WHERE id = $1)`,
		ids["m"])
	b.exec(`ANALYZE stepready.steps`)

	start = time.Now()
	rows := b.mapClaimStart(100, t0)
	claim := time.Since(start)
	require.Len(t, rows, 100)
	require.Equal(t, 0, *rows[0].Index)
	requireJSON(t, `{"i": 99}`, &rows[99].Input, "the 100th element")
	start = time.Now()
	require.Len(t, b.mapClaimStart(100, t0), 100)
	claim2 := time.Since(start)
	t.Logf("fan-out of 100,000 elements: %v; claim and start of 100 of them: %v, then %v", fanOut, claim, claim2)
	require.Less(t, claim2, time.Second, "claiming 100 elements reads 100 rows of the claim index")
}

// TestMapElementsAreNotCountedInTheirTask: deleting elements (as the down migration does) leaves the task's
// counters alone, as inserting them did.
func TestMapElementsAreNotCountedInTheirTask(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	taskID, ids := b.mapTask(`{"over": [1, 2, 3]}`, `{}`, `{}`, t0)
	require.Empty(t, b.mapClaimStart(10, t0))
	counters := func() []int {
		var total, unsat, inError int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT steps_total, steps_unsatisfied, steps_in_error
			FROM stepready.tasks WHERE id = $1`, taskID).Scan(&total, &unsat, &inError))
		return []int{total, unsat, inError}
	}
	require.Equal(t, []int{3, 2, 0}, counters())
	b.exec(`DELETE FROM stepready.steps WHERE map_step_id = $1`, ids["m"])
	require.Equal(t, []int{3, 2, 0}, counters())
}

// TestMapWindowHoldsAcrossConcurrentWorkers: four workers claim, start and complete elements of one map at once
// (each element alone, as separate daemons do), and a sampler reads the committed number of elements in flight
// all along: it never exceeds max_in_flight, and the output is whole and in element order.
func TestMapWindowHoldsAcrossConcurrentWorkers(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	const n, window = 60, 3
	items := make([]string, n)
	for i := range items {
		items[i] = itoa(int64(i))
	}
	_, ids := b.mapTask(`{"over": "${deps.list.items}", "max_in_flight": 3}`, `{"n": "${element}"}`,
		`{"items": [`+strings.Join(items, ", ")+`]}`, t0)
	require.Empty(t, b.mapClaimStart(10, t0))

	done := make(chan struct{})
	var maxSeen atomic.Int64
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			var inFlight int64
			if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.steps WHERE map_step_id = $1
				AND state IN ('enqueued', 'in_progress')`, ids["m"]).Scan(&inFlight); err != nil {
				return
			}
			for {
				cur := maxSeen.Load()
				if inFlight <= cur || maxSeen.CompareAndSwap(cur, inFlight) {
					break
				}
			}
		}
	}()
	var workers sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				var state string
				if err := b.db.Pool.QueryRow(b.ctx, `SELECT state FROM stepready.steps WHERE id = $1`, ids["m"]).
					Scan(&state); err != nil {
					errs <- err
					return
				}
				if state != "in_progress" {
					return
				}
				rows, err := b.db.Pool.Query(b.ctx, `SELECT step_id, attempt, element::text
					FROM stepready.claim_and_start_steps(1, $1, 60000, $2)`, testWorker, t0)
				if err != nil {
					errs <- err
					return
				}
				type started struct {
					ID      int64
					Attempt int
					Element *string // NULL: the join, claimed once the map completed
				}
				got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[started])
				if err != nil {
					errs <- err
					return
				}
				for _, s := range got {
					output := `{}`
					if s.Element != nil {
						output = `{"n": ` + *s.Element + `}`
					}
					if _, err := b.db.Pool.Exec(b.ctx, `SELECT stepready.complete_step($1, $2, $3::jsonb, $4)`,
						s.ID, s.Attempt, output, t0); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- fmt.Errorf("the map did not complete in time")
		}()
	}
	workers.Wait()
	close(done)
	sampler.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	b.requireState(ids["m"], "complete")
	require.LessOrEqual(t, maxSeen.Load(), int64(window), "never more than max_in_flight in flight")
	require.Positive(t, maxSeen.Load())
	want := make([]string, n)
	for i := range want {
		want[i] = `{"n": ` + itoa(int64(i)) + `}`
	}
	requireJSON(t, "["+strings.Join(want, ", ")+"]", b.step(ids["m"]).Output, "every output once, in element order")
}

// A map step's concurrency key limits its elements, not the map step: once fanned out the map step holds no slot
// (it hands its key to its elements), so with a limit of 1 one element runs at a time and all of them run.
func TestMapConcurrencyKeyLimitsTheElementsOnly(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.mapTask(`{"over": "${deps.list.items}"}`, `{"v": "${element}"}`, `{"items": [1, 2, 3]}`, t0)
	b.exec(`UPDATE stepready.steps SET concurrency_key = 'k', concurrency_limit = 1 WHERE id = $1`, ids["m"])
	require.Empty(t, b.mapClaimStart(10, t0), "the claim that picks the map step fans it out")
	var mapKey *string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT concurrency_key FROM stepready.steps WHERE id = $1`,
		ids["m"]).Scan(&mapKey))
	require.Nil(t, mapKey, "the fanned-out map step holds no slot of its key")
	for i := range 3 {
		rows := b.mapClaimStart(10, t0)
		require.Len(t, rows, 1, "element %d: one at a time under a limit of 1", i)
		require.Equal(t, fmt.Sprintf("m[%d]", i), rows[0].Name)
		require.Empty(t, b.mapClaimStart(10, t0), "the key is full while element %d runs", i)
		require.True(t, b.complete(rows[0].StepID, rows[0].Attempt, `{}`, t0))
	}
	require.Equal(t, "complete", b.step(ids["m"]).State)
}

// bigMap creates a task whose map step m fans out into n elements (max_elements n) after a step "first" (not a
// map, created pending) and returns the task id and the step ids; the claim that fans the map out runs at t0.
func (b *lifecycleBundle) bigMap(n int, t0 time.Time) (int64, map[string]int64) {
	b.t.Helper()
	taskID, ids := b.task(fmt.Sprintf(`{"name": "big", "steps": [
		{"name": "m", "handler": "work", "input": {"i": "${index}"},
		 "map": {"over": "${context.items}", "max_elements": %d}},
		{"name": "after", "handler": "h", "depends_on": ["m"]}]}`, n))
	b.exec(`UPDATE stepready.tasks SET context = jsonb_build_object('items',
		(SELECT jsonb_agg(g) FROM generate_series(1, $2::int) g)) WHERE id = $1`, taskID, n)
	require.Empty(b.t, b.mapClaimStart(10, t0))
	b.exec(`UPDATE stepready.tasks SET context = '{}' WHERE id = $1`, taskID)
	var total int
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT map_total FROM stepready.steps WHERE id = $1`, ids["m"]).
		Scan(&total))
	require.Equal(b.t, n, total)
	return taskID, ids
}

// elementStates counts the elements of map step m by state.
func (b *lifecycleBundle) elementStates(m int64) map[string]int {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT state, count(*)::int FROM stepready.steps WHERE map_step_id = $1
		GROUP BY state`, m)
	require.NoError(b.t, err)
	got := map[string]int{}
	var state string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error { got[state] = n; return nil })
	require.NoError(b.t, err)
	return got
}

// eventCount counts the events of a task with this name.
func (b *lifecycleBundle) eventCount(taskID int64, event string) int {
	b.t.Helper()
	return b.intCall(`SELECT count(*)::int FROM stepready.step_events WHERE task_id = $1 AND event = $2`, taskID, event)
}

// callCounting runs sql (one statement, its result discarded) in a transaction of its own with PL/pgSQL
// function calls counted, and returns how many times each of the stepready functions named was called in it.
func (b *lifecycleBundle) callCounting(names []string, sql string, args ...any) map[string]int {
	b.t.Helper()
	calls := map[string]int{}
	require.NoError(b.t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL track_functions = 'pl'`); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, sql, args...); err != nil {
			return err
		}
		rows, err := tx.Query(b.ctx, `SELECT p.proname::text, COALESCE(sum(pg_catalog.pg_stat_get_xact_function_calls(p.oid)), 0)::int
			FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'stepready'::regnamespace AND p.proname = ANY ($1)
			GROUP BY p.proname`, names)
		if err != nil {
			return err
		}
		var name string
		var n int
		_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { calls[name] = n; return nil })
		return err
	}))
	return calls
}

// TestMapCancelTaskOf100000ElementsIsSetBased: cancel_task on a task whose map step has 100,000 elements (three
// complete, two in flight, the rest ready) cancels every unfinished element and writes their events in a few
// statements, not one element at a time: the steps' statement trigger runs once and no event is written through
// _log per step (element by element, both ran 100,000 times and the call took 45 s; set-based, 3 s on the loaded
// 2-core machine). Timing alone is no test on a shared machine: the calls are counted.
func TestMapCancelTaskOf100000ElementsIsSetBased(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 rows")
	}
	b := lifecycleSetup(t)
	t0 := testBase
	const n = 100000
	taskID, ids := b.bigMap(n, t0)
	rows := b.mapClaimStart(5, t0)
	require.Len(t, rows, 5)
	for _, r := range rows[:3] {
		require.True(t, b.complete(r.StepID, r.Attempt, `{}`, t0))
	}
	b.exec(`ANALYZE stepready.steps`)

	at := t0.Add(time.Minute)
	start := time.Now()
	calls := b.callCounting([]string{"_steps_after_update", "_log", "_tasks_propagate_hold"},
		`SELECT stepready.cancel_task($1, 'too big', $2)`, taskID, at)
	t.Logf("cancel_task of a 100,000-element map: %v", time.Since(start))
	// The steps' statement trigger runs for the UPDATE of every step, and once more for the task's
	// tasks_propagate_hold, whose UPDATE finds no claimable step left (a statement trigger runs for 0 rows too).
	require.Equal(t, map[string]int{"_steps_after_update": 2, "_log": 0, "_tasks_propagate_hold": 1}, calls,
		"one UPDATE of the steps, events written set-based, nothing done per step")
	require.Equal(t, n-3+2, int(b.taskEventDetail(taskID, "operator.cancel", "steps_cancelled").(float64)),
		"the map step, its 99,997 unfinished elements and the step after it")

	b.requireStatus(taskID, "cancelled")
	require.Equal(t, map[string]int{"complete": 3, "cancelled": n - 3}, b.elementStates(ids["m"]))
	b.requireState(ids["m"], "cancelled")
	b.requireState(ids["after"], "cancelled")
	require.Equal(t, n-3+2, b.eventCount(taskID, "step.cancelled"), "one step.cancelled event per step cancelled")
	require.Equal(t, 1, b.eventCount(taskID, "operator.cancel"))
	for _, r := range rows[3:] {
		s := b.step(r.StepID)
		require.Equal(t, "cancelled", s.State)
		require.Equal(t, testWorker, deref(s.LeaseOwner), "an element in flight keeps its lease, orphaned")
		ev := b.lastEvents(r.StepID, 1)[0]
		require.Equal(t, "step.cancelled", ev.Event)
		require.Equal(t, "in_progress", deref(ev.FromState))
		require.Equal(t, "too big", ev.Details["reason"])
		require.Equal(t, true, ev.Details["attempt_still_running"])
		require.True(t, at.Equal(ev.At))
	}
	var last int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT max(id) FROM stepready.steps WHERE map_step_id = $1`,
		ids["m"]).Scan(&last))
	ev := b.lastEvents(last, 1)[0]
	require.Equal(t, "step.cancelled", ev.Event)
	require.Equal(t, "pending", deref(ev.FromState))
	require.Equal(t, "cancelled", deref(ev.ToState))
	require.Nil(t, ev.Details["attempt_still_running"])
	var completedAt time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT completed_at FROM stepready.steps WHERE id = $1`, last).
		Scan(&completedAt))
	require.True(t, at.Equal(completedAt))
	// A late report of an attempt in flight changes nothing.
	require.False(t, b.complete(rows[3].StepID, rows[3].Attempt, `{}`, at))
}

// TestMapResolveStepOf100000ElementsIsSetBased: resolve_step on a map step of 100,000 elements cancels its
// unfinished elements in one UPDATE, their events in one INSERT, and no per-row trigger call (2.6 s on the loaded
// 2-core machine; 2.9 s before, when steps_before_update ran for every element).
func TestMapResolveStepOf100000ElementsIsSetBased(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 rows")
	}
	b := lifecycleSetup(t)
	t0 := testBase
	const n = 100000
	taskID, ids := b.bigMap(n, t0)
	rows := b.mapClaimStart(2, t0)
	require.Len(t, rows, 2)
	require.True(t, b.complete(rows[0].StepID, rows[0].Attempt, `{}`, t0))
	b.exec(`ANALYZE stepready.steps`)

	at := t0.Add(time.Minute)
	start := time.Now()
	calls := b.callCounting([]string{"_steps_after_update", "_steps_before_update", "_log"},
		`SELECT stepready.resolve_step($1, '["by hand"]', $2)`, ids["m"], at)
	t.Logf("resolve_step of a 100,000-element map: %v", time.Since(start))
	// The statement trigger for the map step's UPDATE and its elements' (the map step's pass counts its child down
	// itself: issue 22; a third pass for that before); steps_before_update for the map step's own row; its two
	// events (step.resolved, operator.resolve): nothing per element.
	require.Equal(t, map[string]int{"_steps_after_update": 2, "_steps_before_update": 1, "_log": 2}, calls)

	require.Equal(t, map[string]int{"complete": 1, "cancelled": n - 1}, b.elementStates(ids["m"]))
	b.requireState(ids["m"], "resolved_manually")
	require.Equal(t, n-1, b.eventCount(taskID, "step.cancelled"))
	require.Equal(t, testWorker, deref(b.step(rows[1].StepID).LeaseOwner), "the element in flight keeps its lease")
	b.requireStatus(taskID, "in_progress")
	got := b.mapClaimStart(10, at)
	require.Len(t, got, 1, "only the step after the map is claimable")
	require.Equal(t, ids["after"], got[0].StepID)
	require.True(t, b.complete(got[0].StepID, got[0].Attempt, `{}`, at))
	b.requireStatus(taskID, "complete")
}

// taskEventDetail returns details[key] of the newest task-level event of a task with this name.
func (b *lifecycleBundle) taskEventDetail(taskID int64, event, key string) any {
	b.t.Helper()
	evs := eventsNamed(b.taskEvents(taskID), event)
	require.NotEmpty(b.t, evs, "no %s event", event)
	return evs[len(evs)-1].Details[key]
}
