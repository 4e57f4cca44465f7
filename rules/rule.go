package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Do names what a matching rule makes of the attempt. The values are the spellings of the `do` field.
type Do string

// The five actions of docs/daemon.md, "Outcome rules".
const (
	// DoRetry fails the attempt through fail_step, optionally overriding the retry policy for this failure.
	DoRetry Do = "retry"
	// DoFail fails the step permanently (no further attempt, whatever the budget).
	DoFail Do = "fail"
	// DoContinue completes the step, even when the attempt failed.
	DoContinue Do = "continue"
	// DoRepeat ends the iteration successfully and runs the step again (continue_step): polling, pagination.
	DoRepeat Do = "repeat"
	// DoBreak completes the step and ends a repetition.
	DoBreak Do = "break"
)

// Limits on a rules document. They keep compilation cheap enough to run on every definition and every attempt.
const (
	// MaxRules is the largest number of rules (else included) one step may have.
	MaxRules = 100
	// MaxExpressionLength is the longest `when` or `next_input` expression accepted, in bytes (UTF-8).
	MaxExpressionLength = 4096
)

// backoffs are the strategies of stepready.backoff_delay_ms (docs/retry.md).
var backoffs = []string{"none", "fixed", "linear", "exponential"}

// fieldsOf lists the fields each action accepts besides `do`. A field of another action is rejected rather than
// silently ignored.
var fieldsOf = map[Do][]string{
	DoRetry:    {"max_attempts", "backoff", "base_delay_ms", "max_delay_ms"},
	DoFail:     {"class", "message"},
	DoContinue: nil,
	DoRepeat:   {"next_input", "delay_ms"},
	DoBreak:    nil,
}

// Rule is one entry of a step's `rules` list: `{"when": "<CEL bool>", "then": {…}}` or the final
// `{"else": {…}}`.
type Rule struct {
	// When is the CEL condition; empty for the else rule.
	When string
	// Else marks the catch-all last rule.
	Else bool
	// Then is what happens when the rule matches.
	Then Action
}

// Text is how the rule is named in events and errors: its `when` expression, or "else".
func (r Rule) Text() string {
	if r.Else {
		return "else"
	}
	return r.When
}

// Action is the `then` (or `else`) object of a rule. Only the fields of its Do are set; the parser rejects the
// others.
type Action struct {
	// Do is the action.
	Do Do
	// MaxAttempts (retry) overrides the step's max_attempts for this failure: total attempts of the iteration,
	// the first included. Nil keeps the step's policy.
	MaxAttempts *int
	// Backoff (retry) overrides the strategy: none, fixed, linear or exponential. Empty keeps the step's.
	Backoff string
	// BaseDelayMS (retry) overrides base_delay_ms, in milliseconds. Nil keeps the step's.
	BaseDelayMS *int64
	// MaxDelayMS (retry) overrides the cap max_delay_ms, in milliseconds. Nil keeps the step's (an uncapped step
	// stays uncapped).
	MaxDelayMS *int64
	// Class (fail) is the failure class recorded for the permanent failure. Empty keeps the attempt's class, or
	// `permanent` when the attempt succeeded.
	Class string
	// Message (fail) replaces the recorded message. Empty keeps the attempt's message.
	Message string
	// NextInput (repeat) is a CEL expression producing a map: the next iteration's input. Empty keeps the input.
	NextInput string
	// DelayMS (repeat) is the wait before the next iteration, in milliseconds (≥ 0).
	DelayMS int64
}

// parse reads a rules document. null, empty input and [] all mean "no rules".
func parse(doc []byte) ([]Rule, error) {
	doc = bytes.TrimSpace(doc)
	if len(doc) == 0 || bytes.Equal(doc, []byte("null")) {
		return nil, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(doc, &raw); err != nil {
		return nil, &CompileError{Index: -1, Msg: "must be a JSON array of rules: " + jsonMsg(err)}
	}
	if len(raw) > MaxRules {
		return nil, &CompileError{Index: -1, Msg: fmt.Sprintf("%d rules, at most %d are allowed", len(raw), MaxRules)}
	}
	rules := make([]Rule, 0, len(raw))
	for i, r := range raw {
		rule, err := parseRule(i, len(raw), r)
		if err != nil {
			return nil, err
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

func parseRule(i, n int, raw json.RawMessage) (Rule, error) {
	fail := func(field, rule, format string, args ...any) (Rule, error) {
		return Rule{}, &CompileError{Index: i, Field: field, Rule: rule, Msg: fmt.Sprintf(format, args...)}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return fail("", "", `must be an object {"when": …, "then": …} or {"else": …}`)
	}
	if act, ok := obj["else"]; ok {
		if k := unknownKey(obj, "else"); k != "" {
			return fail(k, "else", `unknown field %q (an else rule has only "else")`, k)
		}
		if i != n-1 {
			return fail("else", "else", "else must be the last rule")
		}
		a, err := parseAction(i, "else", "else", act)
		return Rule{Else: true, Then: a}, err
	}
	if k := unknownKey(obj, "when", "then"); k != "" {
		return fail(k, "", `unknown field %q (a rule has "when" and "then", or only "else")`, k)
	}
	var when string
	if err := json.Unmarshal(obj["when"], &when); err != nil || obj["when"] == nil {
		return fail("when", "", "must be a string holding a CEL expression")
	}
	if strings.TrimSpace(when) == "" {
		return fail("when", when, "must not be empty")
	}
	if obj["then"] == nil {
		return fail("then", when, "missing: a rule needs both when and then")
	}
	a, err := parseAction(i, "then", when, obj["then"])
	return Rule{When: when, Then: a}, err
}

func parseAction(i int, at, text string, raw json.RawMessage) (Action, error) {
	fail := func(field, format string, args ...any) (Action, error) {
		if field != "" {
			field = at + "." + field
		} else {
			field = at
		}
		return Action{}, &CompileError{Index: i, Field: field, Rule: text, Msg: fmt.Sprintf(format, args...)}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return fail("", `must be an object with a "do" field`)
	}
	var do string
	if err := json.Unmarshal(obj["do"], &do); err != nil || obj["do"] == nil {
		return fail("do", "must be one of retry, fail, continue, repeat, break")
	}
	allowed, ok := fieldsOf[Do(do)]
	if !ok {
		return fail("do", "must be one of retry, fail, continue, repeat, break, got %q", do)
	}
	a := Action{Do: Do(do)}
	for _, k := range sortedKeys(obj) {
		if k == "do" {
			continue
		}
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return fail(k, "unknown field %q: do: %s takes no other field", k, do)
			}
			return fail(k, "unknown field %q: do: %s accepts %s", k, do, strings.Join(allowed, ", "))
		}
		v := obj[k]
		var err error
		switch k {
		case "max_attempts":
			var n int64
			n, err = jsonInt(v, math.MaxInt32)
			m := int(n)
			a.MaxAttempts = &m
		case "base_delay_ms":
			var n int64
			n, err = jsonDurationMS(v)
			a.BaseDelayMS = &n
		case "max_delay_ms":
			var n int64
			n, err = jsonDurationMS(v)
			a.MaxDelayMS = &n
		case "delay_ms":
			a.DelayMS, err = jsonDurationMS(v)
		case "backoff":
			if json.Unmarshal(v, &a.Backoff) != nil || !slices.Contains(backoffs, a.Backoff) {
				err = fmt.Errorf("must be one of %s, got %s", strings.Join(backoffs, ", "), v)
			}
		case "class", "message", "next_input":
			var s string
			if json.Unmarshal(v, &s) != nil || (k != "message" && strings.TrimSpace(s) == "") {
				err = fmt.Errorf("must be a non-empty string, got %s", v)
			}
			switch k {
			case "class":
				a.Class = s
			case "message":
				a.Message = s
			default:
				a.NextInput = s
			}
		}
		if err != nil {
			return fail(k, "%v", err)
		}
	}
	return a, nil
}

// maxDurationMS is the longest delay a rule may give, in milliseconds: the largest whole number of milliseconds a
// time.Duration holds (about 292 years), the bound every *_ms duration of a definition has (docs/tables.md). A
// longer one would make fail_step's or continue_step's time arithmetic overflow, and the outcome unrecordable.
const maxDurationMS = math.MaxInt64 / int64(time.Millisecond)

// jsonDurationMS reads a JSON integer number of milliseconds in [0, maxDurationMS].
func jsonDurationMS(v json.RawMessage) (int64, error) {
	n, err := jsonInt(v, math.MaxInt64)
	if err == nil && n > maxDurationMS {
		return 0, fmt.Errorf("must be at most %d ms (the longest duration a Go time.Duration holds, about 292 "+
			"years), got %s", maxDurationMS, v)
	}
	return n, err
}

// jsonInt reads a JSON integer in [0, limit]. 3.0 is accepted (JSON does not distinguish), 3.5 is not.
func jsonInt(v json.RawMessage, limit int64) (int64, error) {
	bad := fmt.Errorf("must be an integer >= 0, got %s", v)
	var num json.Number
	if t := bytes.TrimSpace(v); len(t) == 0 || t[0] == '"' || json.Unmarshal(t, &num) != nil {
		return 0, bad
	}
	n, err := strconv.ParseInt(num.String(), 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(num.String(), 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return 0, bad
		}
		n = int64(f)
	}
	if n < 0 || n > limit {
		return 0, bad
	}
	return n, nil
}

// unknownKey returns the first (in sorted order) key of obj that is not allowed, or "".
func unknownKey(obj map[string]json.RawMessage, allowed ...string) string {
	for _, k := range sortedKeys(obj) {
		if !slices.Contains(allowed, k) {
			return k
		}
	}
	return ""
}

func sortedKeys(obj map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// jsonMsg shortens encoding/json's messages ("json: cannot unmarshal object into Go value of type …").
func jsonMsg(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return "got a JSON " + te.Value
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}
