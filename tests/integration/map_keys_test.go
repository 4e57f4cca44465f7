package integration

// Issue 21 §19, SPEC §14 and §19: a map step's flow-control keys may hold ${element}, ${element.PATH} and
// ${index}. The map step keeps them as written (its ${context…} and ${input…} substituted at creation); each
// element's keys are substituted when the fan-out inserts it, so elements with different keys are limited apart
// and elements with the same key share the limit. Anywhere else they are a definition error; an element whose
// key does not resolve fails the map step deterministic (code map_key) before any element is written.

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stepKeys returns the concurrency and rate keys of a step (NULL as "").
func (b *lifecycleBundle) stepKeys(id int64) (string, string) {
	b.t.Helper()
	var c, r *string
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT concurrency_key, rate_key FROM stepready.steps WHERE id = $1`,
		id).Scan(&c, &r))
	return deref(c), deref(r)
}

// elementKeys returns the concurrency keys (rate keys with rate) of map step m's elements in element order.
func (b *lifecycleBundle) elementKeys(m int64, rate bool) []string {
	b.t.Helper()
	col := "concurrency_key"
	if rate {
		col = "rate_key"
	}
	var keys []string
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT array_agg(COALESCE(`+col+`, '') ORDER BY element_index)
		FROM stepready.steps WHERE map_step_id = $1`, m).Scan(&keys))
	return keys
}

// claimedIndexes claims and starts up to 10 steps at asOf and returns the element indexes claimed, in order.
func (b *lifecycleBundle) claimedIndexes(asOf time.Time) ([]int, []mapRow) {
	b.t.Helper()
	rows := b.mapClaimStart(10, asOf)
	idx := []int{}
	for _, r := range rows {
		require.NotNil(b.t, r.Index, "only elements are claimable here, got %s", r.Name)
		idx = append(idx, *r.Index)
	}
	return idx, rows
}

func TestMapElementKeysAreStoredAsWrittenOnTheMapStep(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	// create_task: ${context…} and ${input…} are substituted, ${element…} and ${index} kept for the elements.
	_, ids := b.task(`{"name": "t", "context": {"api": "partner"}, "steps": [
		{"name": "m", "handler": "h", "input": {"region": "eu"},
		 "concurrency": {"key": "host:${element.host}:${input.region}", "limit": 1},
		 "rate_limit": {"key": "api:${context.api}:${index}:${element}", "limit": 1, "period_ms": 1000},
		 "map": {"over": []}}]}`)
	c, r := b.stepKeys(ids["m"])
	require.Equal(t, "host:${element.host}:eu", c)
	require.Equal(t, "api:partner:${index}:${element}", r)

	// The task's concurrency as the default of a map step.
	_, ids = b.task(`{"name": "t", "concurrency": {"key": "h:${element.h}", "limit": 2}, "steps": [
		{"name": "m", "handler": "h", "map": {"over": []}}]}`)
	c, _ = b.stepKeys(ids["m"])
	require.Equal(t, "h:${element.h}", c)

	// A template, with its context given at creation.
	b.exec(`INSERT INTO stepready.task_templates (name, definition) VALUES ('tpl', $1)`,
		`{"context": {"t": "x"}, "steps": [{"name": "m", "handler": "noop", "map": {"over": "${context.items}"},
		  "concurrency": {"key": "t:${context.t}:${element.id}", "limit": 1}}]}`)
	var taskID int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.create_task_from_template('tpl', $1)`,
		`{"t": "acme", "items": []}`).Scan(&taskID))
	c, _ = b.stepKeys(b.stepIDs(taskID)["m"])
	require.Equal(t, "t:acme:${element.id}", c)

	// The plain-SQL path: the insert trigger keeps them for a map step too.
	taskID = int64(b.intCall(`INSERT INTO stepready.tasks (name, context) VALUES ('plain', '{"t": "acme"}')
		RETURNING id::int`))
	var key string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, handler, map,
		concurrency_key, concurrency_limit) VALUES ($1, 'm', 'h', '{"over": [1]}', 't:${context.t}:${index}', 1)
		RETURNING concurrency_key`, taskID).Scan(&key))
	require.Equal(t, "t:acme:${index}", key)
}

func TestMapElementKeysAreDefinitionErrorsOutsideAMapStep(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	for _, tc := range []struct {
		name, def string
		contains  []string
	}{
		{"element in a step that is not a map step", `{"name": "t", "steps": [{"name": "s", "handler": "h",
			"concurrency": {"key": "host:${element.host}", "limit": 1}}]}`,
			[]string{`steps[0] "s": concurrency: key`,
				`placeholder "${element.host}": only the elements of a map step have ${element} and ${index}`}},
		{"index in a rate key", `{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "s", "handler": "h",
			"rate_limit": {"key": "slot:${index}", "limit": 1, "period_ms": 10}}]}`,
			[]string{`steps[1] "s": rate_limit: key`, `placeholder "${index}": only the elements of a map step`}},
		{"the task's key, on a step that is not a map step", `{"name": "t",
			"concurrency": {"key": "${element}", "limit": 1}, "steps": [
			{"name": "m", "handler": "h", "map": {"over": []}}, {"name": "s", "handler": "h"}]}`,
			[]string{`steps[1] "s": concurrency (the task's): key`, `placeholder "${element}": only the elements`}},
		{"index with a path", `{"name": "t", "steps": [{"name": "m", "handler": "h", "map": {"over": []},
			"concurrency": {"key": "${index.x}", "limit": 1}}]}`,
			[]string{`steps[0] "m": concurrency: key`, `placeholder "${index.x}": ${index} has no path`}},
		{"empty path segment", `{"name": "t", "steps": [{"name": "m", "handler": "h", "map": {"over": []},
			"concurrency": {"key": "${element..a}", "limit": 1}}]}`,
			[]string{`steps[0] "m": concurrency: key`, `placeholder "${element..a}" must be ${context.PATH} or ${input.PATH} (or, in a map step's key, ${element}, ${element.PATH} or ${index})`}},
		{"unterminated", `{"name": "t", "steps": [{"name": "m", "handler": "h", "map": {"over": []},
			"concurrency": {"key": "a:${element.x", "limit": 1}}]}`,
			[]string{`steps[0] "m": concurrency: key`, `unterminated placeholder "${element.x"`}},
		{"a context value that would read as a placeholder", `{"name": "t", "context": {"t": "${index}"},
			"steps": [{"name": "m", "handler": "h", "map": {"over": []},
			"concurrency": {"key": "${context.t}:${element}", "limit": 1}}]}`,
			[]string{`steps[0] "m": concurrency: key`, `placeholder "${context.t}": its value "${index}" holds ${`}},
		{"a missing context path in a map step's key", `{"name": "t", "steps": [{"name": "m", "handler": "h",
			"map": {"over": []}, "concurrency": {"key": "${context.nope}:${element}", "limit": 1}}]}`,
			[]string{`steps[0] "m": concurrency: key`, `placeholder "${context.nope}": no value at that path`}},
	} {
		err := b.callErr(`SELECT stepready.create_task($1::jsonb)`, tc.def)
		requireSQLState(t, err, "22023", tc.contains...)
		// The same definitions through create_tasks, as the second of a batch: nothing written.
		err = b.callErr(`SELECT * FROM stepready.create_tasks(jsonb_build_array('{"name": "ok", "steps":
			[{"name": "a", "handler": "h"}]}'::jsonb, $1::jsonb))`, tc.def)
		requireSQLState(t, err, "22023", append([]string{"definitions[1]"}, tc.contains...)...)
	}
	require.Zero(t, b.intCall(`SELECT count(*)::int FROM stepready.tasks`), "nothing written")

	// The plain-SQL path: the insert trigger names the step and the key.
	taskID := b.intCall(`INSERT INTO stepready.tasks (name) VALUES ('plain') RETURNING id::int`)
	err := b.callErr(`INSERT INTO stepready.steps (task_id, name, handler, rate_key, rate_limit, rate_period_ms)
		VALUES ($1, 'z', 'h', 'r:${element.id}', 1, 10)`, taskID)
	requireSQLState(t, err, "22023", `step "z"`, `rate_limit.key`, `placeholder "${element.id}": only the elements of a map step`)
	err = b.callErr(`INSERT INTO stepready.steps (task_id, name, handler, map, concurrency_key, concurrency_limit)
		VALUES ($1, 'y', 'h', '{"over": []}', 'c:${index.no}', 1)`, taskID)
	requireSQLState(t, err, "22023", `step "y"`, `concurrency.key`, `${index} has no path`)
}

// Two elements with different keys are limited apart; two with the same key share the limit (SPEC §14: never
// more than the limit in flight), and the map step itself holds no slot.
func TestMapElementConcurrencyKeys(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.mapTask(`{"over": "${deps.list.hosts}"}`, `{"host": "${element.host}"}`,
		`{"hosts": [{"host": "a"}, {"host": "b"}, {"host": "a"}, {"host": "b"}, {"host": 7}]}`, t0)
	b.exec(`UPDATE stepready.steps SET concurrency_key = 'host:${element.host}', concurrency_limit = 1 WHERE id = $1`,
		ids["m"])
	require.Empty(t, b.mapClaimStart(10, t0), "the claim that picks the map step fans it out")
	require.Equal(t, []string{"host:a", "host:b", "host:a", "host:b", "host:7"}, b.elementKeys(ids["m"], false))
	c, _ := b.stepKeys(ids["m"])
	require.Empty(t, c, "the fanned-out map step holds no slot")

	got, rows := b.claimedIndexes(t0)
	require.ElementsMatch(t, []int{0, 1, 4}, got, "one element per key")
	require.Empty(t, b.mapClaimStart(10, t0), "host:a and host:b are full")
	require.Contains(t, b.explainMessages(b.elementID(ids["m"], 2), t0),
		"concurrency_limited: concurrency limited by host:a: 1 of 1 in flight")
	require.Equal(t, 1, b.inFlight("host:a"))
	require.Equal(t, 1, b.inFlight("host:b"))
	require.Equal(t, 1, b.inFlight("host:7"))
	for _, r := range rows {
		if *r.Index == 0 {
			require.True(t, b.complete(r.StepID, r.Attempt, `"a0"`, t0))
		}
	}
	got, _ = b.claimedIndexes(t0)
	require.Equal(t, []int{2}, got, "element 2 takes the slot element 0 left; host:b is still full")
}

// The same with a rate key: elements of one key share its bucket, elements of another have their own.
func TestMapElementRateKeys(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.mapTask(`{"over": "${deps.list.apis}"}`, `{}`, `{"apis": ["x", "y", "x", "y", "x"]}`, t0)
	b.exec(`UPDATE stepready.steps SET rate_key = 'api:${element}', rate_limit = 1, rate_period_ms = 60000
		WHERE id = $1`, ids["m"])
	require.Empty(t, b.mapClaimStart(10, t0))
	require.Equal(t, []string{"api:x", "api:y", "api:x", "api:y", "api:x"}, b.elementKeys(ids["m"], true))

	got, _ := b.claimedIndexes(t0)
	require.ElementsMatch(t, []int{0, 1}, got, "one token of api:x, one of api:y")
	require.Empty(t, b.mapClaimStart(10, t0.Add(59*time.Second)), "no token before the period")
	requireMessagePrefix(t, b.explainMessages(b.elementID(ids["m"], 2), t0), "rate_limited: rate limited by api:x: next slot in ")
	got, _ = b.claimedIndexes(t0.Add(60 * time.Second))
	require.ElementsMatch(t, []int{2, 3}, got, "the next token of each key")
	got, _ = b.claimedIndexes(t0.Add(120 * time.Second))
	require.Equal(t, []int{4}, got)

	// ${index}: a key per element, none shared.
	_, ids = b.mapTask(`{"over": [10, 20, 30]}`, `{}`, `{}`, t0)
	b.exec(`UPDATE stepready.steps SET rate_key = 'slot:${index}', rate_limit = 1, rate_period_ms = 60000
		WHERE id = $1`, ids["m"])
	require.Empty(t, b.mapClaimStart(10, t0))
	require.Equal(t, []string{"slot:0", "slot:1", "slot:2"}, b.elementKeys(ids["m"], true))
	got, _ = b.claimedIndexes(t0)
	require.ElementsMatch(t, []int{0, 1, 2}, got)
}

// elementID is the id of element i of map step m.
func (b *lifecycleBundle) elementID(m int64, i int) int64 {
	b.t.Helper()
	var id int64
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT id FROM stepready.steps WHERE map_step_id = $1
		AND element_index = $2`, m, i).Scan(&id))
	return id
}

// An element whose key does not resolve (a path missing there, a value that is not a scalar, a key over 255
// characters once substituted) fails the map step deterministic, code map_key, naming the key, the element and
// the placeholder, before any element is written; on_exhausted applies as for a bad `over`.
func TestMapElementKeyThatDoesNotResolveFailsTheMap(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 252) // "api:" and 252 characters: one over the bound
	for _, c := range []struct{ name, key, rateKey, items, want string }{
		{"missing path", "host:${element.host}", "", `[{"host": "a"}, {"port": 1}]`,
			`map step "m": concurrency.key: element 1: key "host:${element.host}": placeholder "${element.host}": no value at that path`},
		{"JSON null", "host:${element.host}", "", `[{"host": null}]`,
			`element 0: key "host:${element.host}": placeholder "${element.host}": no value at that path`},
		{"not a scalar", "host:${element}", "", `["a", {"host": "b"}]`,
			`element 1: key "host:${element}": placeholder "${element}": must be a string, number or boolean, got object`},
		{"too long once substituted", "", "api:${element}", `["short", "` + long + `"]`,
			`map step "m": rate_limit.key: element 1: key "api:${element}": must be at most 255 characters`},
		{"empty once substituted", "${element}", "", `["a", ""]`,
			`element 1: key "${element}": key "${element}" resolves to an empty string`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			t0 := testBase
			taskID, ids := b.mapTask(`{"over": "${deps.list.items}"}`, `{}`, `{"items": `+c.items+`}`, t0)
			if c.key != "" {
				b.exec(`UPDATE stepready.steps SET concurrency_key = $2, concurrency_limit = 1 WHERE id = $1`,
					ids["m"], c.key)
			}
			if c.rateKey != "" {
				b.exec(`UPDATE stepready.steps SET rate_key = $2, rate_limit = 100, rate_period_ms = 1 WHERE id = $1`,
					ids["m"], c.rateKey)
			}
			require.Empty(t, b.mapClaimStart(10, t0))
			m := b.step(ids["m"])
			require.Equal(t, "error", m.State)
			var lastErr struct{ Class, Code, Message string }
			require.NoError(t, json.Unmarshal([]byte(deref(m.LastError)), &lastErr))
			require.Equal(t, "deterministic", lastErr.Class)
			require.Equal(t, "map_key", lastErr.Code)
			require.Contains(t, lastErr.Message, c.want)
			require.Zero(t, b.intCall(`SELECT count(*)::int FROM stepready.steps WHERE map_step_id = $1`, ids["m"]),
				"no element written")
			b.requireStatus(taskID, "error")
		})
	}
}

// TestMapFansOut100000ElementsWithElementKeys: substituting a key per element keeps the fan-out of the largest
// map within a few seconds (the keys are checked in one statement, then written by the one INSERT).
func TestMapFansOut100000ElementsWithElementKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 rows")
	}
	b := lifecycleSetup(t)
	t0 := testBase
	_, ids := b.task(`{"name": "big", "context": {"n": 100000}, "steps": [
		{"name": "m", "handler": "work", "concurrency": {"key": "shard:${element.shard}", "limit": 2},
		 "map": {"over": "${context.items}", "max_elements": 100000}}]}`)
	b.exec(`UPDATE stepready.tasks SET context = jsonb_build_object('items',
		(SELECT jsonb_agg(jsonb_build_object('shard', g % 100)) FROM generate_series(0, 99999) g))
		WHERE id = (SELECT task_id FROM stepready.steps WHERE id = $1)`, ids["m"])
	start := time.Now()
	require.Empty(t, b.mapClaimStart(10, t0))
	fanOut := time.Since(start)
	t.Logf("fan-out of 100,000 elements with a key each: %v", fanOut)
	var keys, n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(DISTINCT concurrency_key), count(*)
		FROM stepready.steps WHERE map_step_id = $1`, ids["m"]).Scan(&keys, &n))
	require.Equal(t, 100000, n)
	require.Equal(t, 100, keys)
	require.Equal(t, "shard:42", b.strCall(`SELECT concurrency_key FROM stepready.steps WHERE map_step_id = $1
		AND element_index = 1042`, ids["m"]))
	b.exec(`UPDATE stepready.tasks SET context = '{}' WHERE id = (SELECT task_id FROM stepready.steps WHERE id = $1)`,
		ids["m"])
	b.exec(`ANALYZE stepready.steps`)
	rows := b.mapClaimStart(100, t0)
	require.Len(t, rows, 100, "two elements of each of the 100 keys would be 200: the claim takes 100")
	perKey := map[string]int{}
	for _, r := range rows {
		perKey[fmt.Sprint(*r.Index%100)]++
	}
	for k, v := range perKey {
		require.LessOrEqual(t, v, 2, "shard %s", k)
	}
}

// requireMessagePrefix requires one of the messages to start with prefix.
func requireMessagePrefix(t *testing.T, messages []string, prefix string) {
	t.Helper()
	for _, m := range messages {
		if strings.HasPrefix(m, prefix) {
			return
		}
	}
	require.Failf(t, "no message with this prefix", "%q in %q", prefix, messages)
}

// TestFlowKeyPlaceholdersRandom drives the one parser of key placeholders (_flow_substitute, sql/047_flow.sql)
// with 400 keys built from the pieces placeholders are made of (a fixed seed), in its three uses: a step's key at
// creation, a map step's key at creation, an element's key at fan-out. For every key:
//   - nothing raises: each use answers a value or a problem, never both;
//   - a key accepted for a step is accepted for a map step, with the same value (a map step only keeps more);
//   - a key accepted for a map step has, at fan-out, either a problem or a value without `${` (every placeholder
//     is substituted, and the element's values here hold none), and a map step's key that kept no placeholder is
//     the element's as it is.
func TestFlowKeyPlaceholdersRandom(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	pieces := []string{"${", "}", "element", "index", "context", "input", ".", "host", "a", "0", "$", ":", "x",
		"${element}", "${element.host}", "${index}", "${context.t}", "${input.a.0}", "{", ""}
	rnd := rand.New(rand.NewPCG(21, 19))
	const (
		context_ = `{"t": "acme", "o": {"k": 1}}`
		input    = `{"a": ["p", {"b": 2}], "n": null}`
		element  = `{"host": "h", "a": [7], "o": {}}`
	)
	type result struct{ Value, Problem *string }
	for range 400 {
		var sb strings.Builder
		for range 1 + rnd.IntN(6) {
			sb.WriteString(pieces[rnd.IntN(len(pieces))])
		}
		key := sb.String()
		var step, mapStep, elem result
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `
			SELECT s.value, s.problem, m.value, m.problem, e.value, e.problem
			  FROM stepready._flow_substitute($1, $2::jsonb, $3::jsonb) s,
			       stepready._flow_substitute($1, $2::jsonb, $3::jsonb, true) m
			  LEFT JOIN LATERAL stepready._flow_substitute(m.value, NULL, NULL, true, $4::jsonb, 3) e ON true`,
			key, context_, input, element).Scan(&step.Value, &step.Problem, &mapStep.Value, &mapStep.Problem,
			&elem.Value, &elem.Problem), "key %q", key)
		for _, r := range []result{step, mapStep} {
			require.True(t, (r.Value == nil) != (r.Problem == nil), "key %q: value or problem: %+v", key, r)
		}
		if step.Problem == nil {
			require.Nil(t, mapStep.Problem, "key %q: accepted for a step, refused for a map step: %s", key,
				deref(mapStep.Problem))
			require.Equal(t, step.Value, mapStep.Value, "key %q", key)
		}
		if mapStep.Value == nil {
			continue
		}
		require.True(t, (elem.Value == nil) != (elem.Problem == nil), "key %q: element: %+v", key, elem)
		if elem.Value != nil {
			require.NotContains(t, *elem.Value, "${", "key %q: every placeholder substituted", key)
		}
		if !strings.Contains(*mapStep.Value, "${") {
			require.Equal(t, mapStep.Value, elem.Value, "key %q: nothing kept, nothing to substitute", key)
		}
	}
}
