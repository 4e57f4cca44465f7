package rules

import (
	"encoding/json"
	"time"
)

// Kind is what the executor does with an attempt once the rules have spoken.
type Kind int

// The decisions. The zero value is Complete.
const (
	// Complete: the attempt succeeded and no rule matched: complete_step with the attempt's output.
	Complete Kind = iota
	// FailWithPolicy: the attempt failed and no rule matched: fail_step with the handler's error document, the
	// step's own retry policy deciding.
	FailWithPolicy
	// Retry (do: retry): fail_step with the error document plus Decision.Retry as `p_error.retry`. The SQL
	// decision order still applies (a non-retryable class, the breaker, an exhausted budget end the step).
	Retry
	// FailPermanent (do: fail): fail_step with `retryable: false`: the step ends in error (or is skipped, per
	// on_exhausted) whatever its budget.
	FailPermanent
	// Continue (do: continue): complete_step even though the attempt may have failed; the output is the
	// attempt's result (null for a failed attempt).
	Continue
	// Repeat (do: repeat): continue_step with the attempt's result as this iteration's output,
	// Decision.NextInput and Decision.Delay.
	Repeat
	// Break (do: break): complete_step with the attempt's result: the repetition ends here.
	Break
)

var kindNames = [...]string{"complete", "fail_with_policy", "retry", "fail", "continue", "repeat", "break"}

// String returns the decision's name as recorded in events: complete, fail_with_policy, retry, fail, continue,
// repeat, break.
func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return "unknown"
	}
	return kindNames[k]
}

// MarshalText writes the decision's name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Decision is the result of evaluating a step's rules against one outcome.
type Decision struct {
	// Kind is what to do.
	Kind Kind
	// RuleIndex is the 0-based index of the rule that matched, or -1 when the default applied.
	RuleIndex int
	// RuleText is the matched rule's `when` expression, "else", or empty for the default.
	RuleText string
	// Retry holds the policy overrides of a Retry decision; nil when the rule overrides nothing (and for every
	// other kind).
	Retry *RetryOverride
	// Class (FailPermanent) is the class to record instead of the attempt's; empty keeps it (an ok attempt
	// failed by a rule then records `permanent`).
	Class string
	// Message (FailPermanent) is the message to record instead of the attempt's; empty keeps it.
	Message string
	// NextInput (Repeat) is the next iteration's input, a JSON object; nil keeps the current input.
	NextInput json.RawMessage
	// Delay (Repeat) is the wait before the next iteration.
	Delay time.Duration
}

// Matched reports whether a rule (rather than the default) decided.
func (d Decision) Matched() bool { return d.RuleIndex >= 0 }

// RetryOverride is the `p_error.retry` object of stepready.fail_step: policy fields that replace the step's own
// for this one failure. Nil fields are omitted and keep the step's value.
type RetryOverride struct {
	// MaxAttempts replaces max_attempts (total attempts of the iteration, the first included). When only this
	// override allows another attempt, fail_step raises the stored budget just enough for it.
	MaxAttempts *int `json:"max_attempts,omitempty"`
	// Backoff replaces the strategy: none, fixed, linear or exponential.
	Backoff string `json:"backoff,omitempty"`
	// BaseDelayMS replaces base_delay_ms, in milliseconds.
	BaseDelayMS *int64 `json:"base_delay_ms,omitempty"`
	// MaxDelayMS replaces the cap max_delay_ms, in milliseconds.
	MaxDelayMS *int64 `json:"max_delay_ms,omitempty"`
}

// RetryJSON returns the `p_error.retry` object for fail_step, or nil when the decision is not a Retry or
// overrides nothing (then leave `retry` out of p_error).
func (d Decision) RetryJSON() json.RawMessage {
	if d.Kind != Retry || d.Retry == nil {
		return nil
	}
	b, _ := json.Marshal(d.Retry) // plain fields: cannot fail
	return b
}

// RuleRef returns the `p_error.rule` value naming the matched rule, {"index": i, "text": "…"}, or nil for the
// default decision.
func (d Decision) RuleRef() map[string]any {
	if !d.Matched() {
		return nil
	}
	return map[string]any{"index": d.RuleIndex, "text": d.RuleText}
}

// EventDetails returns the `details` of the `policy.evaluated` step event: which rule matched and what it
// decided.
//
//	{"matched": true, "rule_index": 1, "rule": "outcome.http.status in [429, 503]", "decision": "retry",
//	 "retry": {"max_attempts": 10, "backoff": "exponential", "base_delay_ms": 2000}}
//
// For the default: {"matched": false, "rule_index": -1, "rule": null, "decision": "complete"}. A Repeat adds
// "delay_ms" and "next_input", a FailPermanent its "class" and "message" overrides.
func (d Decision) EventDetails() map[string]any {
	m := map[string]any{"matched": d.Matched(), "rule_index": d.RuleIndex, "rule": nil, "decision": d.Kind.String()}
	if d.Matched() {
		m["rule"] = d.RuleText
	}
	switch d.Kind {
	case Retry:
		if d.Retry != nil {
			m["retry"] = d.Retry
		}
	case FailPermanent:
		if d.Class != "" {
			m["class"] = d.Class
		}
		if d.Message != "" {
			m["message"] = d.Message
		}
	case Repeat:
		m["delay_ms"] = d.Delay.Milliseconds()
		if d.NextInput != nil {
			m["next_input"] = d.NextInput
		}
	}
	return m
}
