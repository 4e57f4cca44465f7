package rules

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Seed 000, §3.1: HTTP retry on 429/5xx with exponential backoff, 401/403 fail, other errors linear, else continue.
const httpRules = `[
	{"when": "outcome.status == 'error' && outcome.http.status in [429, 500, 502, 503, 504]",
	 "then": {"do": "retry", "max_attempts": 10, "backoff": "exponential", "base_delay_ms": 2000}},
	{"when": "outcome.status == 'error' && outcome.http.status in [401, 403]", "then": {"do": "fail"}},
	{"when": "outcome.status == 'error'", "then": {"do": "retry", "max_attempts": 3, "backoff": "linear", "base_delay_ms": 1000}},
	{"else": {"do": "continue"}}]`

// Seed 000, §3.2: Postgres serialization failure and deadlock.
const pgRules = `[
	{"when": "outcome.status == 'error' && outcome.error.code in ['40001', '40P01']",
	 "then": {"do": "retry", "max_attempts": 5, "backoff": "exponential", "base_delay_ms": 2000}},
	{"when": "outcome.status == 'error'", "then": {"do": "fail", "class": "deterministic"}},
	{"else": {"do": "continue"}}]`

// Seed 000, §3.3: retry on timeout messages.
const timeoutRules = `[
	{"when": "outcome.status == 'error' && outcome.error.message.lowerAscii().contains('timeout')",
	 "then": {"do": "retry", "max_attempts": 3, "backoff": "linear", "base_delay_ms": 1000}},
	{"when": "outcome.status == 'error'", "then": {"do": "fail"}},
	{"else": {"do": "continue"}}]`

// Seed 001: page-number, offset, cursor and next-URL pagination; polling.
const (
	pageRules = `[
	{"when": "outcome.status == 'ok' && outcome.result.page < outcome.result.total_pages",
	 "then": {"do": "repeat", "next_input": "{'page': outcome.result.page + 1, 'page_size': input.page_size}"}}]`
	offsetRules = `[
	{"when": "outcome.status == 'ok' && outcome.result.has_more",
	 "then": {"do": "repeat", "next_input": "{'offset': outcome.result.offset + outcome.result.limit, 'limit': outcome.result.limit}"}},
	{"when": "outcome.status == 'ok'", "then": {"do": "break"}}]`
	cursorRules = `[
	{"when": "outcome.status == 'ok' && outcome.result.?next_cursor.orValue(null) != null",
	 "then": {"do": "repeat", "next_input": "{'cursor': outcome.result.next_cursor}", "delay_ms": 250}},
	{"when": "outcome.status == 'ok'", "then": {"do": "break"}}]`
	urlRules = `[
	{"when": "outcome.status == 'ok' && has(outcome.result.links.next) && outcome.result.links.next != null",
	 "then": {"do": "repeat", "next_input": "{'url': outcome.result.links.next}"}},
	{"when": "outcome.status == 'ok'", "then": {"do": "break"}}]`
	pollRules = `[
	{"when": "outcome.status == 'ok' && outcome.result.status == 'done'", "then": {"do": "break"}},
	{"when": "outcome.status == 'ok' && outcome.result.status in ['pending', 'running']",
	 "then": {"do": "repeat", "delay_ms": 5000}},
	{"when": "outcome.status == 'ok'", "then": {"do": "fail", "class": "permanent", "message": "job failed"}}]`
)

func httpErr(status int) Outcome {
	return Outcome{Error: &OutcomeError{Class: "transient", Message: "HTTP " + strconv.Itoa(status)}, HTTPStatus: status, Attempt: 1}
}

func ok(result string) Outcome { return Outcome{Result: json.RawMessage(result), Attempt: 1} }

func errOutcome(class, code, msg string) Outcome {
	return Outcome{Error: &OutcomeError{Class: class, Code: code, Message: msg}, Attempt: 2}
}

func TestEvaluate(t *testing.T) {
	t.Parallel()

	ten, three, five := 10, 3, 5
	ms := func(n int64) *int64 { return &n }
	tests := []struct {
		name    string
		rules   string
		outcome Outcome
		want    Decision
	}{
		{"no rules ok", ``, ok(`{}`), Decision{Kind: Complete, RuleIndex: -1}},
		{"no rules error", `[]`, httpErr(500), Decision{Kind: FailWithPolicy, RuleIndex: -1}},
		{"no match ok", `[{"when": "outcome.status == 'error'", "then": {"do": "fail"}}]`, ok(`1`), Decision{Kind: Complete, RuleIndex: -1}},
		{"no match error", `[{"when": "outcome.http.status == 404", "then": {"do": "fail"}}]`, httpErr(500), Decision{Kind: FailWithPolicy, RuleIndex: -1}},

		{"http 429 retries exponentially", httpRules, httpErr(429), Decision{Kind: Retry, RuleIndex: 0,
			RuleText: "outcome.status == 'error' && outcome.http.status in [429, 500, 502, 503, 504]",
			Retry:    &RetryOverride{MaxAttempts: &ten, Backoff: "exponential", BaseDelayMS: ms(2000)}}},
		{"http 503 retries exponentially", httpRules, httpErr(503), Decision{Kind: Retry, RuleIndex: 0,
			RuleText: "outcome.status == 'error' && outcome.http.status in [429, 500, 502, 503, 504]",
			Retry:    &RetryOverride{MaxAttempts: &ten, Backoff: "exponential", BaseDelayMS: ms(2000)}}},
		{"http 401 fails", httpRules, httpErr(401), Decision{Kind: FailPermanent, RuleIndex: 1,
			RuleText: "outcome.status == 'error' && outcome.http.status in [401, 403]"}},
		{"http 403 fails", httpRules, httpErr(403), Decision{Kind: FailPermanent, RuleIndex: 1,
			RuleText: "outcome.status == 'error' && outcome.http.status in [401, 403]"}},
		{"http 404 retries linearly", httpRules, httpErr(404), Decision{Kind: Retry, RuleIndex: 2, RuleText: "outcome.status == 'error'",
			Retry: &RetryOverride{MaxAttempts: &three, Backoff: "linear", BaseDelayMS: ms(1000)}}},
		{"http network error retries linearly", httpRules, errOutcome("transient", "", "connection refused"),
			Decision{Kind: Retry, RuleIndex: 2, RuleText: "outcome.status == 'error'",
				Retry: &RetryOverride{MaxAttempts: &three, Backoff: "linear", BaseDelayMS: ms(1000)}}},
		{"http ok continues", httpRules, ok(`{"items": []}`), Decision{Kind: Continue, RuleIndex: 3, RuleText: "else"}},

		{"pg 40001 retries", pgRules, errOutcome("transient", "40001", "could not serialize access"), Decision{Kind: Retry, RuleIndex: 0,
			RuleText: "outcome.status == 'error' && outcome.error.code in ['40001', '40P01']",
			Retry:    &RetryOverride{MaxAttempts: &five, Backoff: "exponential", BaseDelayMS: ms(2000)}}},
		{"pg 40P01 retries", pgRules, errOutcome("transient", "40P01", "deadlock detected"), Decision{Kind: Retry, RuleIndex: 0,
			RuleText: "outcome.status == 'error' && outcome.error.code in ['40001', '40P01']",
			Retry:    &RetryOverride{MaxAttempts: &five, Backoff: "exponential", BaseDelayMS: ms(2000)}}},
		{"pg 23505 fails", pgRules, errOutcome("permanent", "23505", "duplicate key"), Decision{Kind: FailPermanent, RuleIndex: 1,
			RuleText: "outcome.status == 'error'", Class: "deterministic"}},
		{"pg ok continues", pgRules, ok(`null`), Decision{Kind: Continue, RuleIndex: 2, RuleText: "else"}},

		{"timeout message retries", timeoutRules, errOutcome("transient", "", "read: Timeout after 15s"), Decision{Kind: Retry, RuleIndex: 0,
			RuleText: timeoutRulesWhen, Retry: &RetryOverride{MaxAttempts: &three, Backoff: "linear", BaseDelayMS: ms(1000)}}},
		{"other message fails", timeoutRules, errOutcome("transient", "", "division by zero"), Decision{Kind: FailPermanent, RuleIndex: 1,
			RuleText: "outcome.status == 'error'"}},
		{"timeout ok continues", timeoutRules, ok(`{"x": 1}`), Decision{Kind: Continue, RuleIndex: 2, RuleText: "else"}},

		{"page repeats", pageRules, Outcome{Result: json.RawMessage(`{"page": 2, "total_pages": 3, "items": [1]}`),
			Input: json.RawMessage(`{"page": 2, "page_size": 50}`)},
			Decision{Kind: Repeat, RuleIndex: 0, RuleText: pageWhen, NextInput: json.RawMessage(`{"page":3,"page_size":50}`)}},
		{"last page completes", pageRules, Outcome{Result: json.RawMessage(`{"page": 3, "total_pages": 3}`)},
			Decision{Kind: Complete, RuleIndex: -1}},
		{"offset repeats", offsetRules, ok(`{"has_more": true, "offset": 200, "limit": 100, "users": []}`),
			Decision{Kind: Repeat, RuleIndex: 0, RuleText: offsetWhen, NextInput: json.RawMessage(`{"limit":100,"offset":300}`)}},
		{"offset breaks", offsetRules, ok(`{"has_more": false, "offset": 300, "limit": 100}`),
			Decision{Kind: Break, RuleIndex: 1, RuleText: "outcome.status == 'ok'"}},
		{"cursor repeats", cursorRules, ok(`{"next_cursor": "abc=", "results": [1, 2]}`),
			Decision{Kind: Repeat, RuleIndex: 0, RuleText: cursorWhen, NextInput: json.RawMessage(`{"cursor":"abc="}`), Delay: 250 * time.Millisecond}},
		{"cursor null breaks", cursorRules, ok(`{"next_cursor": null}`), Decision{Kind: Break, RuleIndex: 1, RuleText: "outcome.status == 'ok'"}},
		{"cursor absent breaks", cursorRules, ok(`{"results": []}`), Decision{Kind: Break, RuleIndex: 1, RuleText: "outcome.status == 'ok'"}},
		{"url repeats", urlRules, ok(`{"links": {"next": "https://api.example.com/items?page=2"}}`),
			Decision{Kind: Repeat, RuleIndex: 0, RuleText: urlWhen, NextInput: json.RawMessage(`{"url":"https://api.example.com/items?page=2"}`)}},
		{"url absent breaks", urlRules, ok(`{"links": {}}`), Decision{Kind: Break, RuleIndex: 1, RuleText: "outcome.status == 'ok'"}},
		{"poll running repeats", pollRules, ok(`{"status": "running"}`), Decision{Kind: Repeat, RuleIndex: 1, RuleText: pollRepeatWhen, Delay: 5 * time.Second}},
		{"poll done breaks", pollRules, ok(`{"status": "done", "answer": 42}`), Decision{Kind: Break, RuleIndex: 0,
			RuleText: "outcome.status == 'ok' && outcome.result.status == 'done'"}},
		{"poll failed fails", pollRules, ok(`{"status": "failed"}`), Decision{Kind: FailPermanent, RuleIndex: 2,
			RuleText: "outcome.status == 'ok'", Class: "permanent", Message: "job failed"}},
		{"poll error falls to policy", pollRules, httpErr(502), Decision{Kind: FailWithPolicy, RuleIndex: -1}},

		{"variables", `[{"when": "attempt == 2 && iteration == 4 && context.tenant == 'acme' && input.n == 1.5", "then": {"do": "continue"}}]`,
			Outcome{Error: &OutcomeError{}, Attempt: 2, Iteration: 4, Context: json.RawMessage(`{"tenant": "acme"}`), Input: json.RawMessage(`{"n": 1.5}`)},
			Decision{Kind: Continue, RuleIndex: 0, RuleText: "attempt == 2 && iteration == 4 && context.tenant == 'acme' && input.n == 1.5"}},
		{"dyn when", `[{"when": "input.flag", "then": {"do": "break"}}]`, Outcome{Input: json.RawMessage(`{"flag": true}`)},
			Decision{Kind: Break, RuleIndex: 0, RuleText: "input.flag"}},
		{"big and fractional numbers", `[{"when": "input.big == 9007199254740993 && input.f > 1.0 && input.e == 1e300", "then": {"do": "break"}}]`,
			Outcome{Input: json.RawMessage(`{"big": 9007199254740993, "f": 1.25, "e": 1e300}`)},
			Decision{Kind: Break, RuleIndex: 0, RuleText: "input.big == 9007199254740993 && input.f > 1.0 && input.e == 1e300"}},
		{"else repeat keeps nested values", `[{"else": {"do": "repeat", "next_input": "{'a': [1, 2.5, 'x', true, null, {'b': input}], 'd': duration('1s')}"}}]`,
			Outcome{Input: json.RawMessage(`{"k": [1]}`)},
			Decision{Kind: Repeat, RuleIndex: 0, RuleText: "else",
				NextInput: json.RawMessage(`{"a":[1,2.5,"x",true,null,{"b":{"k":[1]}}],"d":"1s"}`)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Compile([]byte(tt.rules))
			require.NoError(t, err)
			got, err := p.Evaluate(context.Background(), tt.outcome)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

const (
	timeoutRulesWhen = "outcome.status == 'error' && outcome.error.message.lowerAscii().contains('timeout')"
	pageWhen         = "outcome.status == 'ok' && outcome.result.page < outcome.result.total_pages"
	offsetWhen       = "outcome.status == 'ok' && outcome.result.has_more"
	cursorWhen       = "outcome.status == 'ok' && outcome.result.?next_cursor.orValue(null) != null"
	urlWhen          = "outcome.status == 'ok' && has(outcome.result.links.next) && outcome.result.links.next != null"
	pollRepeatWhen   = "outcome.status == 'ok' && outcome.result.status in ['pending', 'running']"
)

func TestEvaluateErrors(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		rules   string
		outcome Outcome
		index   int
		field   string
		msg     string
	}{
		{"missing result field", `[{"when": "outcome.result.cursor != ''", "then": {"do": "fail"}}]`, ok(`{"page": 1}`),
			0, "when", `rules[0].when: evaluating "outcome.result.cursor != ''": no such key: cursor`},
		{"field of null result", `[{"when": "outcome.result.status == 'done'", "then": {"do": "break"}}]`, httpErr(500),
			0, "when", "rules[0].when"},
		{"type error", `[{"when": "input.n + 1 > 2", "then": {"do": "fail"}}]`, Outcome{Input: json.RawMessage(`{"n": "x"}`)},
			0, "when", "no such overload"},
		{"dyn when not bool", `[{"when": "input.flag", "then": {"do": "fail"}}]`, Outcome{Input: json.RawMessage(`{"flag": 1}`)},
			0, "when", "got a int, want a bool"},
		{"next_input missing key", `[{"when": "true", "then": {"do": "repeat", "next_input": "{'page': outcome.result.page + 1}"}}]`, ok(`{}`),
			0, "then.next_input", "no such key: page"},
		{"next_input not a map", `[{"when": "true", "then": {"do": "repeat", "next_input": "input"}}]`, Outcome{Input: json.RawMessage(`[1]`)},
			0, "then.next_input", "want a map"},
		{"next_input NaN", `[{"else": {"do": "repeat", "next_input": "{'x': 0.0 / 0.0}"}}]`, ok(`1`),
			0, "else.next_input", "is not a JSON number"},
		{"next_input int keys", `[{"else": {"do": "repeat", "next_input": "{1: 2}"}}]`, ok(`1`),
			0, "else.next_input", "JSON object keys are strings"},
		{"cost limit", `[{"when": "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, a+b+c+d+e+f > 0))))))", "then": {"do": "fail"}}]`,
			ok(`1`), 0, "when", "cost limit"},
		{"bad result JSON", `[{"when": "true", "then": {"do": "fail"}}]`, ok(`{`), -1, "", "outcome: outcome.result is not valid JSON"},
		{"bad input JSON", `[{"when": "true", "then": {"do": "fail"}}]`, Outcome{Input: json.RawMessage(`1 2`)}, -1, "", "input is not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Compile([]byte(tt.rules))
			require.NoError(t, err)
			_, err = p.Evaluate(context.Background(), tt.outcome)
			var ee *EvalError
			require.ErrorAs(t, err, &ee)
			require.Equal(t, tt.index, ee.Index)
			require.Equal(t, tt.field, ee.Field)
			require.Contains(t, err.Error(), tt.msg)
			require.NotNil(t, errors.Unwrap(err))
		})
	}
}

func TestEvaluateCancelled(t *testing.T) {
	t.Parallel()
	p, err := Compile([]byte(`[{"when": "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, a+b+c > 0)))", "then": {"do": "fail"}}]`))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = p.Evaluate(ctx, ok(`1`))
	require.ErrorIs(t, err, context.Canceled)
	var ee *EvalError
	require.NotErrorAs(t, err, &ee)
}

func TestEvaluateNilProgram(t *testing.T) {
	t.Parallel()
	var p *Program
	d, err := p.Evaluate(context.Background(), httpErr(500))
	require.NoError(t, err)
	require.Equal(t, FailWithPolicy, d.Kind)
}

func TestDecisionDetails(t *testing.T) {
	t.Parallel()
	p, err := Compile([]byte(httpRules))
	require.NoError(t, err)
	d, err := p.Evaluate(context.Background(), httpErr(429))
	require.NoError(t, err)
	require.JSONEq(t, `{"max_attempts": 10, "backoff": "exponential", "base_delay_ms": 2000}`, string(d.RetryJSON()))
	require.Equal(t, map[string]any{"index": 0, "text": d.RuleText}, d.RuleRef())
	details, err := json.Marshal(d.EventDetails())
	require.NoError(t, err)
	require.JSONEq(t, `{"matched": true, "rule_index": 0, "rule": "outcome.status == 'error' && outcome.http.status in [429, 500, 502, 503, 504]",
		"decision": "retry", "retry": {"max_attempts": 10, "backoff": "exponential", "base_delay_ms": 2000}}`, string(details))

	// A retry without overrides sends no p_error.retry.
	p, err = Compile([]byte(`[{"when": "true", "then": {"do": "retry"}}]`))
	require.NoError(t, err)
	d, err = p.Evaluate(context.Background(), httpErr(500))
	require.NoError(t, err)
	require.Equal(t, Retry, d.Kind)
	require.Nil(t, d.RetryJSON())

	// An override of zero is sent (max_delay_ms: 0 caps every delay at 0).
	p, err = Compile([]byte(`[{"when": "true", "then": {"do": "retry", "max_delay_ms": 0, "max_attempts": 0}}]`))
	require.NoError(t, err)
	d, err = p.Evaluate(context.Background(), httpErr(500))
	require.NoError(t, err)
	require.JSONEq(t, `{"max_delay_ms": 0, "max_attempts": 0}`, string(d.RetryJSON()))

	def := Decision{Kind: Complete, RuleIndex: -1}
	require.Nil(t, def.RuleRef())
	details, err = json.Marshal(def.EventDetails())
	require.NoError(t, err)
	require.JSONEq(t, `{"matched": false, "rule_index": -1, "rule": null, "decision": "complete"}`, string(details))

	rep := Decision{Kind: Repeat, RuleIndex: 2, RuleText: "else", NextInput: json.RawMessage(`{"page":2}`), Delay: time.Second}
	details, err = json.Marshal(rep.EventDetails())
	require.NoError(t, err)
	require.JSONEq(t, `{"matched": true, "rule_index": 2, "rule": "else", "decision": "repeat", "delay_ms": 1000, "next_input": {"page": 2}}`, string(details))

	fail := Decision{Kind: FailPermanent, RuleIndex: 0, RuleText: "true", Class: "deterministic", Message: "m"}
	details, err = json.Marshal(fail.EventDetails())
	require.NoError(t, err)
	require.JSONEq(t, `{"matched": true, "rule_index": 0, "rule": "true", "decision": "fail", "class": "deterministic", "message": "m"}`, string(details))

	for k, want := range map[Kind]string{Complete: "complete", FailWithPolicy: "fail_with_policy", Retry: "retry", FailPermanent: "fail",
		Continue: "continue", Repeat: "repeat", Break: "break", Kind(99): "unknown"} {
		require.Equal(t, want, k.String())
	}
	b, err := json.Marshal(map[string]Kind{"k": Retry})
	require.NoError(t, err)
	require.JSONEq(t, `{"k": "retry"}`, string(b))
}

// TestEvaluateDeps: `deps` holds the direct parents' outputs by name (SPEC §18); without deps it is {}.
func TestEvaluateDeps(t *testing.T) {
	t.Parallel()
	p, err := Compile([]byte(`[{"when": "'fetch' in deps && deps.fetch.items.size() == 0", "then": {"do": "fail"}},
		{"when": "deps.size() == 0", "then": {"do": "break"}}]`))
	require.NoError(t, err)
	d, err := p.Evaluate(context.Background(), Outcome{Attempt: 1, Deps: json.RawMessage(`{"fetch": {"items": []}}`)})
	require.NoError(t, err)
	require.Equal(t, FailPermanent, d.Kind)
	d, err = p.Evaluate(context.Background(), Outcome{Attempt: 1, Deps: json.RawMessage(`{"fetch": {"items": [1]}}`)})
	require.NoError(t, err)
	require.Equal(t, Complete, d.Kind, "no rule matched")
	d, err = p.Evaluate(context.Background(), Outcome{Attempt: 1})
	require.NoError(t, err)
	require.Equal(t, Break, d.Kind, "no deps: {}")
	_, err = p.Evaluate(context.Background(), Outcome{Attempt: 1, Deps: json.RawMessage(`{`)})
	require.ErrorContains(t, err, "deps is not valid JSON")
}
