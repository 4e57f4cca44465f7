package integration

// Issue 21 §19, map element throughput: what working one element costs must not grow with the size of its map.
// Three costs did: the start resolved every input against the task's context and deps, references or not (the
// context that holds the array mapped over is as large as the map); the window's release counted and scanned
// every element of the map at each completion; the fan-out of a literal array read the array again for each
// element it wrote.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// resolveCalls runs query (two columns: a step id and an input) in a transaction of its own on conn, with function
// statistics on, and returns how many times it called stepready._resolve_input and the inputs as text, by step id.
func resolveCalls(t *testing.T, conn *pgx.Conn, query string, args ...any) (int64, []string) {
	t.Helper()
	return functionCalls(t, conn, "_resolve_input", query, args...)
}

// functionCalls is resolveCalls counting the calls of stepready.fn (through callsOf).
func functionCalls(t *testing.T, conn *pgx.Conn, fn, query string, args ...any) (int64, []string) {
	t.Helper()
	var inputs []string
	calls := callsOf(t, conn, []string{fn}, func(tx pgx.Tx) error {
		rows, err := tx.Query(t.Context(), `SELECT COALESCE(x.input::text, 'null') FROM (`+query+`) AS x(id, input)
			ORDER BY x.id`, args...)
		if err != nil {
			return err
		}
		inputs, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return calls[fn], inputs
}

// TestStartResolvesOnlyInputsWithReferences: claim_and_start_steps and start_steps resolve the input of the
// attempts whose input holds `${`, and call nothing for the others. (They called the resolution for every row
// and dropped its result: with a context holding the 10,000 items a map reads, each element's start cost ~0.8 ms.)
func TestStartResolvesOnlyInputsWithReferences(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	conn, err := b.db.Pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	items := `[` + strings.Repeat(`{"n": 1}, `, 999) + `{"n": 1}]`
	def := func(name string) string {
		return `{"name": "` + name + `", "context": {"items": ` + items + `}, "steps": [
			{"name": "none", "handler": "h"},
			{"name": "plain", "handler": "h", "input": {"x": 1}},
			{"name": "ref", "handler": "h", "input": {"task": "${task.id}", "first": "${context.items.0.n}"}}]}`
	}

	// What the workers get: the reference resolved, the rest as written.
	want := func(taskID int64) []string {
		return []string{`{}`, `{"x": 1}`, fmt.Sprintf(`{"task": %d, "first": 1}`, taskID)}
	}

	// One claim and start statement.
	taskID, _ := b.task(def("claimed"))
	calls, inputs := resolveCalls(t, conn.Conn(), `SELECT step_id, input
		FROM stepready.claim_and_start_steps(10, $1, $2, $3)`, testWorker, testLeaseMs, testBase)
	require.Equal(t, want(taskID), inputs)
	require.Equal(t, int64(1), calls, "claim_and_start_steps: one input with references")

	// Claim, then start.
	taskID, ids := b.task(def("started"))
	var claimed []int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT array_agg(step_id) FROM stepready.claim_ready_steps(10, $1, $2, $3)`,
		testWorker, testLeaseMs, testBase).Scan(&claimed))
	require.ElementsMatch(t, []int64{ids["none"], ids["plain"], ids["ref"]}, claimed)
	calls, inputs = resolveCalls(t, conn.Conn(), `SELECT step_id, input FROM stepready.start_steps($1, $2, $3, $4)`,
		claimed, testWorker, testLeaseMs, testBase)
	require.Equal(t, want(taskID), inputs)
	require.Equal(t, int64(1), calls, "start_steps: one input with references")
}

// TestStartLooksWholeReferencesUpWithoutTheParser: an input whose strings are each exactly one reference (the
// common case: `{"pad": "${deps.a.pad}"}`) resolves without the reference parser (_ref_parse), which is kept for
// strings with text around their references. (Scenario 10d: the parser's calls were half the resolution's cost.)
func TestStartLooksWholeReferencesUpWithoutTheParser(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	conn, err := b.db.Pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	taskID, ids := b.task(`{"name": "whole", "context": {"region": "eu"}, "steps": [
		{"name": "a", "handler": "h"},
		{"name": "b", "handler": "h", "depends_on": ["a"],
		 "input": {"pad": "${deps.a.pad}", "list": ["${deps.a.n}", "${task.id}", 3], "region": "${context.region}"}},
		{"name": "c", "handler": "h", "depends_on": ["a"], "input": {"text": "pad ${deps.a.pad} in ${context.region}"}}]}`)
	b.runToComplete(ids["a"], `{"pad": "xyz", "n": 2}`, testBase)
	calls, inputs := functionCalls(t, conn.Conn(), "_ref_parse", `SELECT step_id, input
		FROM stepready.claim_and_start_steps(10, $1, $2, $3)`, testWorker, testLeaseMs, testBase)
	require.Equal(t, []string{fmt.Sprintf(`{"pad": "xyz", "list": [2, %d, 3], "region": "eu"}`, taskID),
		`{"text": "pad xyz in eu"}`}, inputs)
	require.Equal(t, int64(1), calls, "the parser, for c's one string with text around its references")
}

// TestMapWindowReleaseReadsTheWindowNotTheMap: completing an element of a windowed map reads a number of steps
// rows that follows the window (max_in_flight), not the map: here a map of 3,000 elements, 2,500 of them
// complete, window 2. (The release read every element of the map twice, through steps_map_elements_idx: once to
// count the slots in use, once to skip the released elements before the first held one; ~5,500 tuples.)
func TestMapWindowReleaseReadsTheWindowNotTheMap(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	const total, done = 3000, 2500
	_, ids := b.task(fmt.Sprintf(`{"name": "window", "steps": [{"name": "m", "handler": "h",
		"map": {"over": [%s0], "max_in_flight": 2}}]}`, strings.Repeat("0, ", total-1)))
	require.Empty(t, b.mapClaimStart(10, testBase), "the fan-out hands over no element")
	// The first done elements finished (as their runs would have left them), the window then moves on.
	b.exec(`UPDATE stepready.steps SET state = 'complete', attempts = 1, pending_parents = 0,
		output = to_jsonb(element_index), completed_at = $3 WHERE map_step_id = $1 AND element_index < $2`,
		ids["m"], done, testBase)
	b.exec(`VACUUM ANALYZE stepready.steps`)
	rows := b.mapClaimStart(10, testBase)
	require.Len(t, rows, 2, "the window: two elements")
	require.Equal(t, done, *rows[0].Index)
	require.Equal(t, done+1, *rows[1].Index)

	conn, err := b.db.Pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	before := stepsTuplesRead(t, conn.Conn())
	var ok bool
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT stepready.complete_step($1, $2, '"x"', $3)`,
		rows[0].StepID, rows[0].Attempt, testBase).Scan(&ok))
	require.True(t, ok)
	read := stepsTuplesRead(t, conn.Conn()) - before
	t.Logf("completing one element of %d (%d complete, window 2) read %d steps tuples", total, done, read)
	require.Less(t, read, int64(100), "the completion's release read the map, not the window")
	require.Equal(t, []string{"complete", "in_progress", "pending", "held"}, b.mapStates(ids["m"])[done:done+4],
		"the next element in order took the freed slot")
}

// TestMapFanOutOfALiteralArrayIsLinear: fanning out a map over a literal array (held in the step's `map`) costs
// what fanning out the same array read from the context costs. (The fan-out read max_in_flight out of `map` for
// each element it wrote, and so the whole array each time: O(n²); 50,000 elements took ~4 times as long as
// over a reference.)
func TestMapFanOutOfALiteralArrayIsLinear(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 2 × 50,000 rows")
	}
	t.Parallel()
	const n = 50000
	array := `[` + strings.Repeat(`1, `, n-1) + `1]`
	fanOut := func(def string) time.Duration {
		b := lifecycleSetup(t)
		b.task(def)
		start := time.Now()
		require.Empty(t, b.mapClaimStart(10, testBase))
		elapsed := time.Since(start)
		var got int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.steps WHERE map_step_id IS NOT NULL`).
			Scan(&got))
		require.Equal(t, n, got)
		return elapsed
	}
	byRef := fanOut(`{"name": "ref", "context": {"items": ` + array + `}, "steps": [{"name": "m", "handler": "h",
		"map": {"over": "${context.items}", "max_elements": 100000, "max_in_flight": 10}}]}`)
	literal := fanOut(`{"name": "literal", "steps": [{"name": "m", "handler": "h",
		"map": {"over": ` + array + `, "max_elements": 100000, "max_in_flight": 10}}]}`)
	t.Logf("fan-out of %d elements: over a reference %v, over a literal array %v", n, byRef, literal)
	require.Less(t, literal, 2*byRef+500*time.Millisecond,
		"the literal array's fan-out grows faster than the reference's")
}
