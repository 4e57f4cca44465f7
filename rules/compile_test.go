package rules

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		doc   string
		index int
		field string
		msg   string // substring of Error()
	}{
		{"not an array", `{"when": "true"}`, -1, "", "rules: must be a JSON array of rules: got a JSON object"},
		{"not JSON", `[`, -1, "", "rules: must be a JSON array"},
		{"rule not an object", `[1]`, 0, "", "rules[0]: must be an object"},
		{"syntax error", `[{"when": "outcome.status ==", "then": {"do": "fail"}}]`, 0, "when", "rules[0].when: ERROR: <input>:1:"},
		{"non-bool when", `[{"when": "true", "then": {"do": "fail"}}, {"when": "attempt + 1", "then": {"do": "fail"}}]`, 1, "when",
			`rules[1].when: must evaluate to a bool, but "attempt + 1" has type int`},
		{"string when", `[{"when": "outcome.status", "then": {"do": "fail"}}]`, 0, "when", "has type string"},
		{"unknown variable", `[{"when": "status == 'error'", "then": {"do": "fail"}}]`, 0, "when", "undeclared reference to 'status'"},
		{"unknown outcome field", `[{"when": "outcome.htp.status == 429", "then": {"do": "fail"}}]`, 0, "when", "undefined field 'htp'"},
		{"type mismatch", `[{"when": "outcome.http.status == 'x'", "then": {"do": "fail"}}]`, 0, "when", "found no matching overload"},
		{"empty when", `[{"when": " ", "then": {"do": "fail"}}]`, 0, "when", "must not be empty"},
		{"when not a string", `[{"when": true, "then": {"do": "fail"}}]`, 0, "when", "must be a string"},
		{"missing then", `[{"when": "true"}]`, 0, "then", "a rule needs both when and then"},
		{"bad do", `[{"when": "true", "then": {"do": "jump"}}]`, 0, "then.do", `must be one of retry, fail, continue, repeat, break, got "jump"`},
		{"missing do", `[{"when": "true", "then": {}}]`, 0, "then.do", "must be one of"},
		{"then not an object", `[{"when": "true", "then": "retry"}]`, 0, "then", `must be an object with a "do" field`},
		{"unknown rule field", `[{"when": "true", "then": {"do": "fail"}, "unless": "x"}]`, 0, "unless", `unknown field "unless"`},
		{"unknown action field", `[{"when": "true", "then": {"do": "retry", "attempts": 3}}]`, 0, "then.attempts",
			`rules[0].then.attempts: unknown field "attempts": do: retry accepts max_attempts, backoff, base_delay_ms, max_delay_ms`},
		{"field of another action", `[{"when": "true", "then": {"do": "retry", "delay_ms": 3}}]`, 0, "then.delay_ms", `unknown field "delay_ms"`},
		{"field on break", `[{"when": "true", "then": {"do": "break", "class": "x"}}]`, 0, "then.class", "do: break takes no other field"},
		{"else not last", `[{"else": {"do": "continue"}}, {"when": "true", "then": {"do": "fail"}}]`, 0, "else", "rules[0].else: else must be the last rule"},
		{"else with when", `[{"when": "true", "else": {"do": "continue"}}]`, 0, "when", `unknown field "when"`},
		{"bad else action", `[{"when": "true", "then": {"do": "fail"}}, {"else": {"do": "nope"}}]`, 1, "else.do", "rules[1].else.do: must be one of"},
		{"bad backoff", `[{"when": "true", "then": {"do": "retry", "backoff": "quadratic"}}]`, 0, "then.backoff", "must be one of none, fixed, linear, exponential"},
		{"negative max_attempts", `[{"when": "true", "then": {"do": "retry", "max_attempts": -1}}]`, 0, "then.max_attempts", "must be an integer >= 0, got -1"},
		{"fractional delay", `[{"when": "true", "then": {"do": "retry", "base_delay_ms": 1.5}}]`, 0, "then.base_delay_ms", "must be an integer >= 0"},
		{"string delay", `[{"when": "true", "then": {"do": "repeat", "delay_ms": "5"}}]`, 0, "then.delay_ms", "must be an integer >= 0"},
		{"huge max_attempts", `[{"when": "true", "then": {"do": "retry", "max_attempts": 1e12}}]`, 0, "then.max_attempts", "must be an integer >= 0"},
		{"delay beyond a Go duration", `[{"when": "true", "then": {"do": "retry", "max_delay_ms": 9223372036855}}]`, 0,
			"then.max_delay_ms", "must be at most 9223372036854 ms (the longest duration a Go time.Duration holds"},
		{"repeat delay beyond a Go duration", `[{"when": "true", "then": {"do": "repeat", "delay_ms": 9223372036855}}]`, 0,
			"then.delay_ms", "must be at most 9223372036854 ms"},
		{"next_input not a map", `[{"when": "true", "then": {"do": "repeat", "next_input": "outcome.result.page + 1"}}]`, 0, "then.next_input",
			"must evaluate to a map"},
		{"next_input syntax", `[{"when": "true", "then": {"do": "repeat", "next_input": "{'page': }"}}]`, 0, "then.next_input", "Syntax error"},
		{"empty next_input", `[{"when": "true", "then": {"do": "repeat", "next_input": ""}}]`, 0, "then.next_input", "must be a non-empty string"},
		{"too many rules", "[" + strings.Repeat(`{"when": "true", "then": {"do": "fail"}},`, MaxRules) + `{"else": {"do": "fail"}}]`, -1, "", "at most 100"},
		{"too long", `[{"when": "` + strings.Repeat("true && ", MaxExpressionLength/8) + `true", "then": {"do": "fail"}}]`, 0, "when", "at most 4096"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Compile([]byte(tt.doc))
			require.Nil(t, p)
			var ce *CompileError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tt.index, ce.Index, "index")
			require.Equal(t, tt.field, ce.Field, "field")
			require.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestCompileNoRules(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{"", "null", " [] "} {
		p, err := Compile([]byte(doc))
		require.NoError(t, err, doc)
		require.Empty(t, p.Rules())
	}
}

func TestCompileErrorText(t *testing.T) {
	t.Parallel()
	_, err := Compile([]byte(`[{"when": "outcome.status == 'error'", "then": {"do": "fail"}}, {"when": "nope", "then": {"do": "fail"}}]`))
	require.EqualError(t, err, "rules[1].when: ERROR: <input>:1:1: undeclared reference to 'nope'\n | nope\n | ^")
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "nope", ce.Rule)
}

func TestCompileRules(t *testing.T) {
	t.Parallel()
	p, err := Compile([]byte(`[
		{"when": "outcome.status == 'error'", "then": {"do": "retry", "max_attempts": 3.0, "backoff": "linear", "base_delay_ms": 10, "max_delay_ms": 0}},
		{"when": "input.flag", "then": {"do": "fail", "class": "deterministic", "message": ""}},
		{"when": "true", "then": {"do": "repeat", "next_input": "input", "delay_ms": 5}},
		{"else": {"do": "break"}}]`))
	require.NoError(t, err)
	three, ten, zero := 3, int64(10), int64(0)
	require.Equal(t, []Rule{
		{When: "outcome.status == 'error'", Then: Action{Do: DoRetry, MaxAttempts: &three, Backoff: "linear", BaseDelayMS: &ten, MaxDelayMS: &zero}},
		{When: "input.flag", Then: Action{Do: DoFail, Class: "deterministic"}},
		{When: "true", Then: Action{Do: DoRepeat, NextInput: "input", DelayMS: 5}},
		{Else: true, Then: Action{Do: DoBreak}},
	}, p.Rules())
}

func TestCompileCache(t *testing.T) {
	t.Parallel()
	doc := []byte(`[{"when": "outcome.http.status == 418 && attempt > 0", "then": {"do": "fail"}}]`)
	p1, err := Compile(doc)
	require.NoError(t, err)
	p2, err := Compile(append([]byte(nil), doc...))
	require.NoError(t, err)
	require.Same(t, p1, p2)

	// Concurrent compiles of one new document share one program.
	doc = []byte(`[{"when": "outcome.http.status == 419", "then": {"do": "fail"}}]`)
	var wg sync.WaitGroup
	progs := make([]*Program, 8)
	for i := range progs {
		wg.Go(func() {
			p, err := Compile(doc)
			if err == nil {
				progs[i] = p
			}
		})
	}
	wg.Wait()
	for _, p := range progs {
		require.Same(t, progs[0], p)
	}

	// Errors are cached too.
	bad := []byte(`[{"when": "nope", "then": {"do": "fail"}}]`)
	_, err1 := Compile(bad)
	_, err2 := Compile(bad)
	require.Same(t, err1, err2)
}

func TestLRUBounded(t *testing.T) {
	t.Parallel()
	c := newLRU(2)
	key := func(i int) (k [32]byte) { k[0] = byte(i); return k }
	ps := []*Program{{}, {}, {}}
	for i, p := range ps {
		got, _ := c.put(key(i), p, nil)
		require.Same(t, p, got)
	}
	require.Equal(t, 2, c.len())
	_, _, ok := c.get(key(0))
	require.False(t, ok, "the oldest entry is dropped")
	got, _, ok := c.get(key(2))
	require.True(t, ok)
	require.Same(t, ps[2], got)

	// A second put of a stored key returns the first result.
	got, _ = c.put(key(2), &Program{}, nil)
	require.Same(t, ps[2], got)

	// Errors other than *CompileError are not stored.
	_, err := c.put(key(9), nil, errors.New("env"))
	require.Error(t, err)
	_, _, ok = c.get(key(9))
	require.False(t, ok)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	def := `{"name": "t", "steps": [
		{"name": "a", "handler": "noop"},
		{"name": "b", "handler": "http", "rules": [{"when": "outcome.http.status == 429", "then": {"do": "retry"}}]},
		{"name": "fetch", "handler": "http", "rules": [{"when": "true", "then": {"do": "fail"}}, {"when": "outcome.result.x +", "then": {"do": "fail"}}]},
		{"name": "d", "rules": [{"else": {"do": "skip"}}]}
	]}`
	err := Validate([]byte(def))
	require.Error(t, err)
	msg := err.Error()
	require.True(t, strings.HasPrefix(msg, `steps[2] "fetch": rules[1].when: ERROR: <input>:1:`), msg)
	require.Contains(t, msg, `steps[3] "d": rules[0].else.do: must be one of retry, fail, continue, repeat, break, got "skip"`)

	var se *StepError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 2, se.StepIndex)
	require.Equal(t, "fetch", se.Step)
	require.Equal(t, 1, se.Err.Index)
	var ce *CompileError
	require.ErrorAs(t, err, &ce)

	require.NoError(t, Validate([]byte(`{"name": "t", "steps": [{"name": "a", "handler": "noop", "rules": null}]}`)))
	require.NoError(t, Validate([]byte(`{"name": "t"}`)))
	require.ErrorContains(t, Validate([]byte(`[]`)), "definition: got a JSON array")
}

func ExampleValidate() {
	err := Validate([]byte(`{"name": "sync", "steps": [
		{"name": "fetch", "handler": "http", "rules": [
			{"when": "outcome.status == 'error' && outcome.http.status in [429, 503]", "then": {"do": "retry"}},
			{"when": "outcome.http.status", "then": {"do": "fail"}}]}]}`))
	fmt.Println(err)
	// Output: steps[0] "fetch": rules[1].when: must evaluate to a bool, but "outcome.http.status" has type int
}
