package rules

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzCompile feeds arbitrary rules documents to Compile (the committed corpus is in testdata/fuzz/FuzzCompile)
// and evaluates whatever compiles against a success and a failure. Neither may panic (Compile and Evaluate
// recover, so an "internal error" is the fuzzer's finding), and every error must be of the documented type.
func FuzzCompile(f *testing.F) {
	for _, doc := range []string{httpRules, pgRules, timeoutRules, pageRules, offsetRules, cursorRules, urlRules, pollRules} {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		p, err := Compile(doc)
		if err != nil {
			ce, ok := errors.AsType[*CompileError](err)
			if !ok {
				t.Fatalf("Compile returned %T, want *CompileError: %v", err, err)
			}
			if strings.Contains(ce.Msg, "internal error") {
				t.Fatalf("Compile panicked: %v", err)
			}
			if ce.Index < -1 || ce.Error() == "" {
				t.Fatalf("malformed CompileError %#v", ce)
			}
			return
		}
		for _, o := range []Outcome{
			{Result: json.RawMessage(`{"page": 1, "status": "done", "next_cursor": "x"}`), Input: json.RawMessage(`{"page": 1}`), Attempt: 1},
			{Error: &OutcomeError{Class: "transient", Message: "timeout", Code: "40001"}, HTTPStatus: 503, Attempt: 2, Iteration: 3},
		} {
			checkEvaluate(t, p, o)
		}
	})
}

// FuzzEvaluate evaluates rules (fuzzed documents, usually the seed patterns) against arbitrary step inputs,
// results and errors (the committed corpus is in testdata/fuzz/FuzzEvaluate).
func FuzzEvaluate(f *testing.F) {
	f.Add(pageRules, []byte(`{"page": 2, "total_pages": 3}`), []byte(`{"page_size": 50}`), []byte(`{}`), false, "", "", 0, 1, 0)
	f.Add(cursorRules, []byte(`{"next_cursor": "abc"}`), []byte(`{}`), []byte(`null`), false, "", "", 0, 1, 2)
	f.Add(httpRules, []byte(``), []byte(`{"url": "http://x"}`), []byte(`{}`), true, "rate_limited", "429", 429, 3, 0)
	f.Add(pgRules, []byte(`null`), []byte(`[1, 2.5, "x"]`), []byte(`{"a": {"b": [true]}}`), true, "transient", "40P01", 0, 1, 0)
	f.Add(timeoutRules, []byte(`"done"`), []byte(`1e400`), []byte(`{}`), true, "timeout", "", 0, 2, 9)
	f.Add(pollRules, []byte(`{"status": "running"}`), []byte(`{}`), []byte(`{}`), false, "", "", 200, 1, 7)
	f.Fuzz(func(t *testing.T, rules string, result, input, tctx []byte, failed bool, class, code string, status, attempt, iteration int) {
		p, err := Compile([]byte(rules))
		if err != nil {
			return
		}
		o := Outcome{Result: result, Input: input, Context: tctx, HTTPStatus: status, Attempt: attempt, Iteration: iteration}
		if failed {
			o.Error = &OutcomeError{Class: class, Code: code, Message: string(result)}
		}
		checkEvaluate(t, p, o)
	})
}

func checkEvaluate(t *testing.T, p *Program, o Outcome) {
	t.Helper()
	d, err := p.Evaluate(context.Background(), o)
	if err != nil {
		ee, ok := errors.AsType[*EvalError](err)
		if !ok {
			t.Fatalf("Evaluate returned %T, want *EvalError: %v", err, err)
		}
		if strings.Contains(ee.Error(), "internal error") {
			t.Fatalf("Evaluate panicked: %v", err)
		}
		return
	}
	if d.RuleIndex < -1 || d.RuleIndex >= len(p.rules) {
		t.Fatalf("rule index %d out of range", d.RuleIndex)
	}
	if d.Kind == Repeat && d.NextInput != nil {
		var m map[string]any
		if err := json.Unmarshal(d.NextInput, &m); err != nil || m == nil {
			t.Fatalf("next input %s is not a JSON object: %v", d.NextInput, err)
		}
	}
	if d.Delay < 0 {
		t.Fatalf("negative delay %v", d.Delay)
	}
	if _, err := json.Marshal(d.EventDetails()); err != nil {
		t.Fatalf("event details do not encode: %v", err)
	}
}
