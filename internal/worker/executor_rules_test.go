package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/internal/templates"
	"github.com/stepready/stepready/rules"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

func TestExecutorAppliesOutcomeRules(t *testing.T) {
	t.Parallel()
	unavailable := steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
		return nil, &steps.Error{Class: steps.ClassTransient, HTTPStatus: 503, Code: "503", Err: errors.New("service unavailable")}
	})
	unauthorized := steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
		return nil, &steps.Error{Class: steps.ClassTransient, HTTPStatus: 401, Err: errors.New("unauthorized")}
	})
	okPage := steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		var in struct{ Page int }
		if err := s.DecodeInput(&in); err != nil {
			return nil, err
		}
		return map[string]any{"page": in.Page, "has_more": in.Page < 3}, nil
	})
	const httpRules = `"rules": [
		{"when": "outcome.status == 'error' && outcome.http.status in [429, 500, 502, 503, 504]",
		 "then": {"do": "retry", "max_attempts": 10, "backoff": "fixed", "base_delay_ms": 1234}},
		{"when": "outcome.status == 'error' && outcome.http.status in [401, 403]", "then": {"do": "fail"}}]`
	cases := []struct {
		name     string
		handler  steps.HandlerFunc
		extra    string
		state    string
		class    string
		decision string
		rule     int
	}{
		{"503 retries with the rule's overrides", unavailable, httpRules, "waiting_for_retry", "transient", "retry", 0},
		{"401 fails permanently", unauthorized, httpRules, "error", "transient", "fail", 1},
		{"ok with no matching rule completes", okPage, httpRules + `, "input": {"page": 3}`, "complete", "", "complete", -1},
		{"repeat while has_more", okPage, `"input": {"page": 1}, "rules": [
			{"when": "outcome.status == 'ok' && outcome.result.has_more",
			 "then": {"do": "repeat", "next_input": "{'page': outcome.result.page + 1}", "delay_ms": 0}},
			{"else": {"do": "break"}}]`, "pending", "", "repeat", 0},
		{"a rule that errors at run time is a contract failure", okPage, `"input": {"page": 1}, "rules": [
			{"when": "outcome.result.missing == 1", "then": {"do": "break"}}]`, "waiting_for_retry", "contract_failure", "", 0},
		{"rules that do not compile fail deterministically", okPage, `"input": {"page": 1}, "rules": [
			{"when": "this is not CEL (", "then": {"do": "break"}}]`, "error", "deterministic", "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			c, got := b.runOnce(t, tc.handler, tc.extra)
			require.Equal(t, tc.state, got.State)
			require.Equal(t, tc.class, got.Class)
			if tc.decision == "" {
				return
			}
			var decision string
			var rule int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT details ->> 'decision',
				(details ->> 'rule_index')::int FROM stepready.step_events
				WHERE step_id = $1 AND event = 'policy.evaluated'`, c.StepID).Scan(&decision, &rule))
			require.Equal(t, tc.decision, decision)
			require.Equal(t, tc.rule, rule)
			if tc.decision == "retry" {
				require.Equal(t, int64(1234), b.retryDelay(t, c.StepID), "the rule's backoff override decided the delay")
			}
			if tc.decision == "repeat" {
				var input string
				require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT input::text FROM stepready.steps
					WHERE id = $1`, c.StepID).Scan(&input))
				require.JSONEq(t, `{"page": 2}`, input)
			}
		})
	}
}

// statusOutput is a handler output that reports the HTTP status it came from.
type statusOutput struct {
	Status int `json:"status"`
}

func (o statusOutput) HTTPStatus() int { return o.Status }

// A successful attempt's outcome.http.status is the status its output reports (steps.OutputWithHTTPStatus), 0
// for an output that reports none; the builtin http handler's output reports the response's status.
func TestExecutorRulesSeeTheHTTPStatusOfASuccess(t *testing.T) {
	t.Parallel()
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		w.WriteHeader(code)
	}))
	t.Cleanup(server.Close)

	// The rule records outcome.http.status as the next input, so the test reads exactly what the rule saw.
	const rules = `"rules": [{"when": "outcome.status == 'ok'",
		"then": {"do": "repeat", "next_input": "{'seen': outcome.http.status}"}}]`
	cases := []struct {
		name    string
		handler string
		input   string
		want    int
	}{
		{"an output reporting 202", "reports", `{"status": 202}`, 202},
		{"an output reporting 200", "reports", `{"status": 200}`, 200},
		{"an output reporting nothing", "plain", `{}`, 0},
		{"the http built-in, 202 Accepted", "http", fmt.Sprintf(`{"url": %q}`, server.URL+"/202"), 202},
		{"the http built-in, an expected 404", "http", fmt.Sprintf(`{"url": %q, "expect": [404]}`, server.URL+"/404"), 404},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			b.reg.MustRegister("reports", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
				var out statusOutput
				return out, s.DecodeInput(&out)
			}))
			b.reg.MustRegister("plain", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
				return map[string]int{"status": 201}, nil
			}))
			require.NoError(t, builtin.Register(b.reg, builtin.Options{HTTPClient: server.Client()}))
			c := b.claimOne(t, tc.handler, `"input": `+tc.input+`, `+rules)
			b.exec.Run(context.Background(), c, time.Now())
			require.Equal(t, "pending", b.row(t, c.StepID).State, "the rule repeated the step")
			var seen int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT (input ->> 'seen')::int
				FROM stepready.steps WHERE id = $1`, c.StepID).Scan(&seen))
			require.Equal(t, tc.want, seen)
		})
	}
}

// lastError returns the step's last_error document (nil when it has none).
func (b *execBundle) lastError(t *testing.T, id int64) map[string]any {
	t.Helper()
	var raw []byte
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT last_error FROM stepready.steps WHERE id = $1`,
		id).Scan(&raw))
	if raw == nil {
		return nil
	}
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	return doc
}

// events returns the details of the step's events of one kind, in order.
func (b *execBundle) events(t *testing.T, id int64, event string) []json.RawMessage {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT details FROM stepready.step_events
		WHERE step_id = $1 AND event = $2 ORDER BY id`, id, event)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[json.RawMessage])
	require.NoError(t, err)
	return out
}

// claimNamed creates a task from the definition def with plain SQL INSERTs into stepready.tasks and
// stepready.steps, in the definition's step order (nothing validates the rules' CEL on that path), claims all
// its steps and returns the claim of the step called name.
func (b *execBundle) claimNamed(t *testing.T, def, name string) store.ClaimedStep {
	t.Helper()
	ctx := context.Background()
	var d struct {
		Name  string
		Steps []struct {
			Name, Handler string
			Rules         json.RawMessage
		}
	}
	require.NoError(t, json.Unmarshal([]byte(def), &d))
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var taskID int64
		if err := tx.QueryRow(ctx, `INSERT INTO stepready.tasks (name) VALUES ($1) RETURNING id`, d.Name).Scan(&taskID); err != nil {
			return err
		}
		for _, st := range d.Steps {
			if _, err := tx.Exec(ctx, `INSERT INTO stepready.steps (task_id, name, handler, rules) VALUES ($1, $2, $3, $4)`,
				taskID, st.Name, st.Handler, st.Rules); err != nil {
				return err
			}
		}
		return nil
	}))
	claimed, err := store.ClaimReadySteps(ctx, b.db.Pool, 100, "w", time.Minute)
	require.NoError(t, err)
	for _, c := range claimed {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("step %q not claimed (claimed %v)", name, claimed)
	return store.ClaimedStep{}
}

// Rules that do not compile (only plain SQL can store them) fail the attempt before the handler runs, as
// `deterministic`, not retryable, with exactly the message creation-time validation gives for the same
// definition.
func TestExecutorFailsUncompilableRulesWithoutRunningTheHandler(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, rules string
	}{
		{"syntax error", `[{"when": "true", "then": {"do": "break"}}, {"when": "outcome.nope ==", "then": {"do": "fail"}}]`},
		{"non-bool when", `[{"when": "attempt + 1", "then": {"do": "fail"}}]`},
		{"unknown variable", `[{"when": "outcome.status == 'ok' && nope > 1", "then": {"do": "break"}}]`},
		{"unknown action", `[{"when": "true", "then": {"do": "explode"}}]`},
		{"a rule that is not an object", `[{"when": "true", "then": {"do": "break"}}, 7]`},
		{"else not last", `[{"else": {"do": "break"}}, {"when": "true", "then": {"do": "fail"}}]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			var calls atomic.Int32
			b.reg.MustRegister("h", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
				calls.Add(1)
				return "ran", nil
			}))
			// The bad step is the third of its task, so the message's index is the step's position.
			def := `{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"},
				{"name": "fetch", "handler": "h", "rules": ` + tc.rules + `}]}`
			want := rules.Validate([]byte(def))
			require.Error(t, want, "creation-time validation refuses the definition")

			c := b.claimNamed(t, def, "fetch")
			b.exec.Run(context.Background(), c, time.Now())
			require.Zero(t, calls.Load(), "the handler did not run")

			got := b.row(t, c.StepID)
			require.Equal(t, "error", got.State)
			require.Equal(t, "deterministic", got.Class)
			require.Equal(t, 1, got.Attempts)
			require.Equal(t, want.Error(), got.Message, "the creation-time message, word for word")
			require.True(t, strings.HasPrefix(got.Message, `steps[2] "fetch": rules`), got.Message)
			lastErr := b.lastError(t, c.StepID)
			require.Equal(t, "not_retryable", lastErr["reason"])
			require.Equal(t, false, lastErr["retryable"])
			require.Empty(t, b.events(t, c.StepID, "policy.evaluated"), "no rule was evaluated")
		})
	}
}

// The timeout-message example's rules (examples/policies/timeout-message.yaml) as they are stored.
func timeoutMessageRules(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../examples/policies/timeout-message.yaml")
	require.NoError(t, err)
	def, err := templates.ParseDefinition("timeout-message.yaml", data)
	require.NoError(t, err)
	var d struct {
		Steps []struct {
			Rules json.RawMessage `json:"rules"`
		} `json:"steps"`
	}
	require.NoError(t, json.Unmarshal(def, &d))
	require.Len(t, d.Steps, 1)
	return string(d.Steps[0].Rules)
}

// Every failed attempt goes through the rules with the class, message and stack it is recorded with: a timeout,
// an abandoned handler, a panic, an unencodable output (SPEC §8: rules are evaluated after each attempt).
func TestExecutorRulesSeeEveryFailure(t *testing.T) {
	t.Parallel()
	// The handler that ignores its deadline is abandoned, not killed: let it go once the test is done.
	stubborn := make(chan struct{})
	t.Cleanup(func() { close(stubborn) })
	timeoutRules := timeoutMessageRules(t)
	const panicRules = `[{"when": "outcome.status == 'error' && outcome.error.class == 'permanent' && ` +
		`outcome.error.message.startsWith('handler panicked: kaboom')", "then": {"do": "fail", "message": "rule saw the panic"}}]`
	cases := []struct {
		name      string
		extra     string
		handler   steps.HandlerFunc
		state     string
		class     string
		message   string
		decision  string
		delayMS   int64 // the retry's delay, when retried
		wantStack bool
	}{
		{name: "the step's deadline", extra: `"timeout_ms": 50, "rules": ` + timeoutRules,
			handler: func(ctx context.Context, _ *steps.Step) (any, error) { <-ctx.Done(); return nil, ctx.Err() },
			state:   "waiting_for_retry", class: "timeout", message: "context deadline exceeded", decision: "retry", delayMS: 20},
		{name: "an abandoned handler", extra: `"timeout_ms": 50, "rules": ` + timeoutRules,
			handler: func(context.Context, *steps.Step) (any, error) { <-stubborn; return nil, nil },
			state:   "waiting_for_retry", class: "timeout", message: "handler ignored the end of its context and was abandoned",
			decision: "retry", delayMS: 20},
		{name: "a panic failed by a rule", extra: `"rules": ` + panicRules,
			handler: func(context.Context, *steps.Step) (any, error) { panic("kaboom") },
			state:   "error", class: "permanent", message: "rule saw the panic", decision: "fail", wantStack: true},
		{name: "a panic continued by a rule", extra: `"rules": [{"when": "outcome.error.class == 'permanent'", "then": {"do": "continue"}}]`,
			handler: func(context.Context, *steps.Step) (any, error) { panic("kaboom") },
			state:   "complete", decision: "continue"},
		{name: "a panic no rule matches", extra: `"rules": [{"when": "outcome.status == 'ok'", "then": {"do": "break"}}]`,
			handler: func(context.Context, *steps.Step) (any, error) { panic("kaboom") },
			state:   "error", class: "permanent", message: "handler panicked: kaboom", decision: "fail_with_policy", wantStack: true},
		{name: "an unencodable output", extra: `"rules": [{"when": "outcome.error.class == 'contract_failure'", "then": {"do": "fail"}}]`,
			handler: func(context.Context, *steps.Step) (any, error) { return make(chan int), nil },
			state:   "error", class: "contract_failure", decision: "fail"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			c, got := b.runOnce(t, tc.handler, tc.extra)
			require.Equal(t, tc.state, got.State)
			evals := b.events(t, c.StepID, "policy.evaluated")
			require.Len(t, evals, 1, "the rules were evaluated")
			var ev struct{ Decision string }
			require.NoError(t, json.Unmarshal(evals[0], &ev))
			require.Equal(t, tc.decision, ev.Decision)
			if tc.class == "" {
				return
			}
			require.Equal(t, tc.class, got.Class)
			if tc.message != "" {
				require.Equal(t, tc.message, got.Message)
			}
			lastErr := b.lastError(t, c.StepID)
			if tc.wantStack {
				require.Contains(t, lastErr["stack"], "runtime/debug.Stack", "the panic's stack is kept")
				failed := b.events(t, c.StepID, "attempt.failed")
				require.Len(t, failed, 1)
				require.Contains(t, string(failed[0]), "runtime/debug.Stack", "and in the event")
			}
			if tc.delayMS > 0 {
				require.Equal(t, tc.delayMS, b.retryDelay(t, c.StepID), "the rule's linear backoff")
			}
		})
	}
}

// A handler's steps.Repeat goes through the rules too: they see an ok outcome whose result is the iteration's
// output; a matching rule decides instead of the handler, and without a match the handler's repetition applies.
func TestExecutorRulesJudgeAHandlersRepeat(t *testing.T) {
	t.Parallel()
	pager := steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		var in struct{ Page int }
		if err := s.DecodeInput(&in); err != nil {
			return nil, err
		}
		return nil, steps.Repeat(map[string]int{"page": in.Page}, map[string]int{"page": in.Page + 1}, time.Hour)
	})
	cases := []struct {
		name, rules string
		state       string
		iteration   int
		input       string // the step's input afterwards
		output      string // the step's output afterwards, "" when not checked
		event       string // the policy.evaluated details
		delay       time.Duration
	}{
		{name: "no rule matches: the handler repeats",
			rules: `[{"when": "outcome.status == 'error'", "then": {"do": "fail"}}]`,
			state: "pending", iteration: 1, input: `{"page": 3}`, delay: time.Hour,
			event: `{"matched": false, "rule_index": -1, "rule": null, "decision": "repeat", "delay_ms": 3600000,
				"next_input": {"page": 3}, "handler_repeat": true}`},
		{name: "break ends the repetition",
			rules: `[{"when": "outcome.result.page >= 2", "then": {"do": "break"}}]`,
			state: "complete", input: `{"page": 2}`, output: `{"page": 2}`,
			event: `{"matched": true, "rule_index": 0, "rule": "outcome.result.page >= 2", "decision": "break",
				"handler_repeat": true}`},
		{name: "fail fails the step",
			rules: `[{"when": "outcome.status == 'ok'", "then": {"do": "fail", "message": "no more pages wanted"}}]`,
			state: "error", input: `{"page": 2}`,
			event: `{"matched": true, "rule_index": 0, "rule": "outcome.status == 'ok'", "decision": "fail",
				"message": "no more pages wanted", "handler_repeat": true}`},
		{name: "a repeat rule without next_input keeps the handler's next input, with its own delay",
			rules: `[{"when": "outcome.status == 'ok'", "then": {"do": "repeat", "delay_ms": 5}}]`,
			state: "pending", iteration: 1, input: `{"page": 3}`, delay: 5 * time.Millisecond,
			event: `{"matched": true, "rule_index": 0, "rule": "outcome.status == 'ok'", "decision": "repeat",
				"delay_ms": 5, "next_input": {"page": 3}, "handler_repeat": true}`},
		{name: "a repeat rule's next_input wins",
			rules: `[{"when": "outcome.status == 'ok'", "then": {"do": "repeat", "next_input": "{'page': 10}"}}]`,
			state: "pending", iteration: 1, input: `{"page": 10}`,
			event: `{"matched": true, "rule_index": 0, "rule": "outcome.status == 'ok'", "decision": "repeat",
				"delay_ms": 0, "next_input": {"page": 10}, "handler_repeat": true}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := execSetup(t)
			b.reg.MustRegister("pager", pager)
			c := b.claimOne(t, "pager", `"input": {"page": 2}, "rules": `+tc.rules)
			b.exec.Run(context.Background(), c, time.Now())
			got := b.row(t, c.StepID)
			require.Equal(t, tc.state, got.State)
			require.Equal(t, tc.iteration, got.Iteration)
			var input string
			var wait time.Duration
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT input::text,
				COALESCE(next_attempt_at - last_attempted_at, '0') FROM stepready.steps WHERE id = $1`, c.StepID).Scan(&input, &wait))
			require.JSONEq(t, tc.input, input)
			if tc.output != "" {
				require.NotNil(t, got.Output)
				require.JSONEq(t, tc.output, *got.Output)
			}
			evals := b.events(t, c.StepID, "policy.evaluated")
			require.Len(t, evals, 1)
			require.JSONEq(t, tc.event, string(evals[0]))
			if tc.state == "pending" {
				var delay int64
				require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT (details ->> 'delay_ms')::bigint
					FROM stepready.step_events WHERE step_id = $1 AND event = 'iteration.continued'`, c.StepID).Scan(&delay))
				require.Equal(t, tc.delay.Milliseconds(), delay)
			}
		})
	}
}

// The policy.evaluated event says which rule matched (its index and text) and what it decided, with the
// decision's parameters, read back from stepready.step_events.
func TestPolicyEvaluatedEventDetails(t *testing.T) {
	t.Parallel()
	b := execSetup(t)
	b.reg.MustRegister("h", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) {
		return nil, &steps.Error{Class: steps.ClassTransient, HTTPStatus: 503, Err: errors.New("service unavailable")}
	}))
	c := b.claimOne(t, "h", `"rules": [
		{"when": "outcome.http.status == 401", "then": {"do": "fail"}},
		{"when": "outcome.status == 'error' && outcome.http.status in [429, 503]",
		 "then": {"do": "retry", "max_attempts": 7, "backoff": "fixed", "base_delay_ms": 42}}]`)
	b.exec.Run(context.Background(), c, time.Now())

	var ruleIndex int
	var rule, decision string
	var details []byte
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT (details ->> 'rule_index')::int,
		details ->> 'rule', details ->> 'decision', details FROM stepready.step_events
		WHERE step_id = $1 AND event = 'policy.evaluated'`, c.StepID).Scan(&ruleIndex, &rule, &decision, &details))
	require.Equal(t, 1, ruleIndex)
	require.Equal(t, "outcome.status == 'error' && outcome.http.status in [429, 503]", rule)
	require.Equal(t, "retry", decision)
	require.JSONEq(t, `{"matched": true, "rule_index": 1, "rule": "outcome.status == 'error' && outcome.http.status in [429, 503]",
		"decision": "retry", "retry": {"max_attempts": 7, "backoff": "fixed", "base_delay_ms": 42},
		"error": {"class": "transient", "message": "service unavailable", "http_status": 503}}`, string(details))

	// The failure names the same rule.
	lastErr := b.lastError(t, c.StepID)
	require.Equal(t, map[string]any{"index": float64(1), "text": rule}, lastErr["rule"])
	require.Equal(t, "waiting_for_retry", b.row(t, c.StepID).State)
}
