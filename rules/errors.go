package rules

import (
	"fmt"
	"strconv"
)

// CompileError reports a rules document that does not parse or a rule whose CEL expression does not compile or
// type-check. Compile and Validate return it (Validate wraps it in a *StepError); a daemon that meets it at run
// time (rules inserted by plain SQL) records the step's failure with class `deterministic`, without running the
// handler, and this message inside a *StepError (`steps[i] "name": …`), as Validate reports it.
type CompileError struct {
	// Index is the 0-based position of the offending rule, or -1 when the document as a whole is wrong (not a
	// JSON array, too many rules).
	Index int
	// Field is the offending field inside the rule, in the document's own spelling: "when", "then.do",
	// "then.next_input", "else.backoff"… Empty when the rule as a whole is wrong.
	Field string
	// Rule is the rule's text: its `when` expression, "else", or empty when it has neither.
	Rule string
	// Msg is what is wrong; for CEL errors it is CEL's own message, with line, column and caret.
	Msg string
}

// Error implements error: `rules[1].when: <message>`, `rules[3]: <message>` or `rules: <message>`.
func (e *CompileError) Error() string {
	return e.where() + ": " + e.Msg
}

func (e *CompileError) where() string {
	w := "rules"
	if e.Index >= 0 {
		w += "[" + strconv.Itoa(e.Index) + "]"
	}
	if e.Field != "" {
		w += "." + e.Field
	}
	return w
}

// EvalError reports a rule that compiled but failed while being evaluated against an outcome: a missing map key
// (`outcome.result.cursor` on a result without one), a type mismatch inside a dyn value, the cost limit, a
// `next_input` that is not a JSON object, or an outcome whose JSON does not decode. It is the step's contract
// with its handler that broke, not the engine: the executor records the attempt as a failure of class
// `contract_failure` (retryable, counted by the circuit breaker) with this message.
type EvalError struct {
	// Index is the 0-based position of the rule being evaluated, or -1 when the outcome itself was unusable.
	Index int
	// Field is "when", "then.next_input", or empty for the outcome.
	Field string
	// Rule is the rule's text (its `when` expression, or "else").
	Rule string
	// Err is the underlying error (CEL's evaluation error or a decoding error).
	Err error
}

// Error implements error: `rules[1].when: evaluating "outcome.result.x > 1": no such key: x`.
func (e *EvalError) Error() string {
	w := (&CompileError{Index: e.Index, Field: e.Field}).where()
	if e.Index < 0 {
		w = "outcome"
	}
	if e.Rule != "" && e.Rule != "else" {
		return fmt.Sprintf("%s: evaluating %q: %v", w, e.Rule, e.Err)
	}
	return fmt.Sprintf("%s: %v", w, e.Err)
}

// Unwrap returns the underlying error.
func (e *EvalError) Unwrap() error { return e.Err }

// StepError locates a rules error inside a task definition. Validate returns it (joined when several steps are
// wrong).
type StepError struct {
	// StepIndex is the 0-based position of the step in the definition's `steps` array.
	StepIndex int
	// Step is the step's name (empty when the definition gives none).
	Step string
	// Err is the *CompileError of the step's rules.
	Err *CompileError
}

// Error implements error: `steps[2] "fetch": rules[1].when: <CEL message>`.
func (e *StepError) Error() string {
	return fmt.Sprintf("steps[%d] %q: %v", e.StepIndex, e.Step, e.Err)
}

// Unwrap returns the *CompileError.
func (e *StepError) Unwrap() error { return e.Err }
