package rules_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/stepready/stepready/rules"
)

func ExampleProgram_Evaluate() {
	prog, err := rules.Compile([]byte(`[
		{"when": "outcome.status == 'error' && outcome.http.status in [429, 500, 502, 503, 504]",
		 "then": {"do": "retry", "max_attempts": 10, "backoff": "exponential", "base_delay_ms": 2000}},
		{"when": "outcome.status == 'ok' && has(outcome.result.next_cursor)",
		 "then": {"do": "repeat", "next_input": "{'cursor': outcome.result.next_cursor}"}},
		{"else": {"do": "continue"}}]`))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	d, _ := prog.Evaluate(ctx, rules.Outcome{Error: &rules.OutcomeError{Class: "rate_limited"}, HTTPStatus: 429, Attempt: 1})
	fmt.Println(d.Kind, d.RuleIndex, string(d.RetryJSON()))

	d, _ = prog.Evaluate(ctx, rules.Outcome{Result: json.RawMessage(`{"items": [1], "next_cursor": "c2"}`), Attempt: 1})
	fmt.Println(d.Kind, d.RuleIndex, string(d.NextInput))

	d, _ = prog.Evaluate(ctx, rules.Outcome{Result: json.RawMessage(`{"items": []}`), Attempt: 1})
	fmt.Println(d.Kind, d.RuleText)

	_, err = prog.Evaluate(ctx, rules.Outcome{Error: &rules.OutcomeError{Class: "transient"}, Attempt: 1})
	fmt.Println(err)
	// Output:
	// retry 0 {"max_attempts":10,"backoff":"exponential","base_delay_ms":2000}
	// repeat 1 {"cursor":"c2"}
	// continue else
	// <nil>
}
