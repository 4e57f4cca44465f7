package rules_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stepready/stepready/internal/templates"
	"github.com/stepready/stepready/rules"
)

// policyExamplesDir holds the task definitions of docs/policies.md.
const policyExamplesDir = "../examples/policies"

// policyProgram is the compiled rules of one step of an example.
type policyProgram struct {
	name string // file/step
	file string
	prog *rules.Program
}

// loadPolicyPrograms compiles the rules of every step of every example in examples/policies.
func loadPolicyPrograms(tb testing.TB) []policyProgram {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(policyExamplesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no examples in %s: %v", policyExamplesDir, err)
	}
	var out []policyProgram
	for _, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		file := filepath.Base(path)
		def, err := templates.ParseDefinition(file, data)
		if err != nil {
			tb.Fatal(err)
		}
		var d struct {
			Steps []struct {
				Name  string          `json:"name"`
				Rules json.RawMessage `json:"rules"`
			} `json:"steps"`
		}
		if err := json.Unmarshal(def, &d); err != nil {
			tb.Fatal(err)
		}
		for _, st := range d.Steps {
			if len(st.Rules) == 0 {
				continue
			}
			p, err := rules.Compile(st.Rules)
			if err != nil {
				tb.Fatalf("%s: step %s: %v", file, st.Name, err)
			}
			out = append(out, policyProgram{name: file + "/" + st.Name, file: file, prog: p})
		}
	}
	return out
}

// lowerASCII is CEL's lowerAscii: only A-Z change.
func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// policyOracles say, without CEL, which rule of a retry example must match a failed outcome. They are the
// conditions of docs/policies.md written in Go: the fuzzer looks for an outcome on which the two disagree.
var policyOracles = map[string]func(o rules.Outcome) int{
	"http-status.yaml": func(o rules.Outcome) int {
		switch {
		case slices.Contains([]int{429, 500, 502, 503, 504}, o.HTTPStatus):
			return 0
		case o.HTTPStatus == 401 || o.HTTPStatus == 403:
			return 1
		}
		return 2
	},
	"postgres-serialization.yaml": func(o rules.Outcome) int {
		if o.Error.Code == "40001" || o.Error.Code == "40P01" {
			return 0
		}
		return 1
	},
	"timeout-message.yaml": func(o rules.Outcome) int {
		if o.Error.Class == "timeout" || strings.Contains(lowerASCII(o.Error.Message), "timeout") {
			return 0
		}
		return 1
	},
}

// FuzzPolicyExamples evaluates the rules of every example of docs/policies.md (retry and repetition alike)
// against arbitrary step inputs, results, task contexts and failures (committed corpus in
// testdata/fuzz/FuzzPolicyExamples). Nothing may panic; an error must be an *EvalError; a decision must be
// the `do` of the rule it names; a retry example never turns a success into anything but completion, never
// completes a failure, and picks the rule its Go oracle picks.
func FuzzPolicyExamples(f *testing.F) {
	progs := loadPolicyPrograms(f)
	f.Add([]byte(`{"url": "http://api.example.test/v1/items"}`), []byte(`{"items": [1]}`), []byte(`{}`),
		true, "transient", "503", "unexpected status 503", 503, 1, 0)
	f.Add([]byte(`{"page": 1, "page_size": 50}`), []byte(`{"page": 1, "total_pages": 3, "items": []}`), []byte(`null`),
		false, "", "", "", 200, 1, 0)
	f.Add([]byte(`{"batch": 7}`), []byte(``), []byte(`{"tenant": "acme"}`),
		true, "transient", "", "read TIMEOUT after 5s", 0, 2, 0)
	f.Add([]byte(`{"query": "INSERT"}`), []byte(`null`), []byte(`{}`), true, "transient", "40P01", "deadlock detected", 0, 3, 1)
	f.Fuzz(func(t *testing.T, input, result, tctx []byte, failed bool, class, code, message string, status, attempt, iteration int) {
		o := rules.Outcome{Input: input, Context: tctx, HTTPStatus: status, Attempt: attempt, Iteration: iteration}
		if failed {
			o.Error = &rules.OutcomeError{Class: class, Code: code, Message: message}
		} else {
			o.Result = result
		}
		for _, p := range progs {
			d, err := p.prog.Evaluate(context.Background(), o)
			if err != nil {
				ee, ok := errors.AsType[*rules.EvalError](err)
				if !ok {
					t.Fatalf("%s: Evaluate returned %T, want *rules.EvalError: %v", p.name, err, err)
				}
				if strings.Contains(err.Error(), "internal error") {
					t.Fatalf("%s: Evaluate panicked: %v", p.name, err)
				}
				if ee.Error() == "" {
					t.Fatalf("%s: empty error", p.name)
				}
				continue
			}
			checkPolicyDecision(t, p, o, d)
		}
	})
}

func checkPolicyDecision(t *testing.T, p policyProgram, o rules.Outcome, d rules.Decision) {
	t.Helper()
	rs := p.prog.Rules()
	if d.RuleIndex < -1 || d.RuleIndex >= len(rs) {
		t.Fatalf("%s: rule index %d of %d rules", p.name, d.RuleIndex, len(rs))
	}
	kindOf := map[rules.Do]rules.Kind{rules.DoRetry: rules.Retry, rules.DoFail: rules.FailPermanent,
		rules.DoContinue: rules.Continue, rules.DoRepeat: rules.Repeat, rules.DoBreak: rules.Break}
	switch {
	case d.RuleIndex >= 0 && d.Kind != kindOf[rs[d.RuleIndex].Then.Do]:
		t.Fatalf("%s: rule %d says %s, decision is %s", p.name, d.RuleIndex, rs[d.RuleIndex].Then.Do, d.Kind)
	case d.RuleIndex < 0 && o.Error == nil && d.Kind != rules.Complete:
		t.Fatalf("%s: no rule matched a success, decision is %s", p.name, d.Kind)
	case d.RuleIndex < 0 && o.Error != nil && d.Kind != rules.FailWithPolicy:
		t.Fatalf("%s: no rule matched a failure, decision is %s", p.name, d.Kind)
	case d.Kind == rules.Repeat && d.Delay < 0:
		t.Fatalf("%s: negative delay %s", p.name, d.Delay)
	}
	if d.Kind == rules.Repeat && d.NextInput != nil {
		var m map[string]any
		if err := json.Unmarshal(d.NextInput, &m); err != nil || m == nil {
			t.Fatalf("%s: next input %s is not a JSON object: %v", p.name, d.NextInput, err)
		}
	}
	if d.Kind == rules.Retry {
		if raw := d.RetryJSON(); raw != nil && !json.Valid(raw) {
			t.Fatalf("%s: retry overrides %q are not JSON", p.name, raw)
		}
	}
	oracle, ok := policyOracles[p.file]
	if !ok {
		return
	}
	if o.Error == nil {
		if d.Kind != rules.Complete || d.RuleIndex != -1 {
			t.Fatalf("%s: a success was decided %s by rule %d", p.name, d.Kind, d.RuleIndex)
		}
		return
	}
	if want := oracle(o); d.RuleIndex != want {
		t.Fatalf("%s: failure %+v (http %d) matched rule %d, want %d", p.name, *o.Error, o.HTTPStatus, d.RuleIndex, want)
	}
}
