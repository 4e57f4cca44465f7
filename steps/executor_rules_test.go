package steps_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
			b.reg.MustRegister("h", tc.handler)
			c := b.claimOne(t, "h", tc.extra)
			b.exec.Run(context.Background(), c, time.Now())
			got := b.row(t, c.StepID)
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
				var delay int64
				require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT (details ->> 'delay_ms')::bigint
					FROM stepready.step_events WHERE step_id = $1 AND event = 'retry.scheduled'`, c.StepID).Scan(&delay))
				require.Equal(t, int64(1234), delay, "the rule's backoff override decided the delay")
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
