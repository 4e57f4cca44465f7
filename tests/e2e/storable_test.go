package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/steps/builtin"
)

// Issue 27 finding 3: an outcome PostgreSQL cannot store is made storable or refused at once. Whatever the http,
// exec and Go handlers return, each step below ends after exactly one attempt, recorded in the database (never
// left to its lease: nothing is `stalled`), with what was sanitised in its output, or with the refusal, the
// executor's or the database's own message, in last_error.
func TestOutcomesTheDatabaseCannotStore(t *testing.T) {
	t.Parallel()
	bodies := map[string]struct {
		contentType string
		body        []byte
	}{
		"/nul":     {"application/json", []byte(`{"s": "a\u0000b"}`)},
		"/utf8":    {"application/json", []byte("{\"s\": \"a\xffb\"}")},
		"/lone":    {"application/json", []byte(`{"s": "a\ud800b"}`)},
		"/huge":    {"application/json", []byte(`{"n": 1e1000000}`)},
		"/tiny":    {"application/json", []byte(`{"n": 1e-1000000}`)},
		"/text":    {"text/plain", []byte("a\x00b\xffc")},
		"/nul-key": {"application/json", []byte(`{"k\u0000": 1}`)},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := bodies[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", b.contentType)
		_, _ = w.Write(b.body)
	}))
	t.Cleanup(srv.Close)

	goHandler := func(out any, err error) steps.Handler {
		return steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) { return out, err })
	}

	type want struct {
		state  string   // the step's state after its one attempt
		class  string   // last_error's class ("" when the step completed)
		msg    []string // fragments of last_error's message
		output string   // the step's output, when it completed
	}
	cases := []struct {
		name    string
		step    string // the definition's step fields besides name and retry
		handler steps.Handler
		want    want
	}{
		// Go handlers.
		{"go: NUL in a raw JSON string", `"handler": "go_nul_raw"`,
			goHandler(json.RawMessage(`{"s": "a\u0000b"}`), nil),
			want{"error", "contract_failure", []string{"handler output: $.s: a string holds the NUL character"}, ""}},
		{"go: NUL in a Go string", `"handler": "go_nul_string"`,
			goHandler(map[string]any{"items": []string{"ok", "a\x00b"}}, nil),
			want{"error", "contract_failure", []string{"handler output: $.items[1]: a string holds the NUL"}, ""}},
		{"go: NUL in a member name", `"handler": "go_nul_key"`,
			goHandler(map[string]int{"k\x00": 1}, nil),
			want{"error", "contract_failure", []string{"$ (a member name): a string holds the NUL"}, ""}},
		{"go: invalid UTF-8 in a raw JSON string", `"handler": "go_utf8"`,
			goHandler(json.RawMessage("{\"s\": \"a\xffb\"}"), nil),
			want{"complete", "", nil, `{"s": "a\ufffdb"}`}},
		{"go: a lone surrogate", `"handler": "go_lone"`,
			goHandler(json.RawMessage(`{"s": "\udc00x\ud83d\ude00"}`), nil),
			want{"complete", "", nil, `{"s": "\ufffdx😀"}`}},
		{"go: a number beyond numeric", `"handler": "go_huge"`,
			goHandler(json.RawMessage(`{"n": 1e1000000}`), nil),
			want{"error", "contract_failure", []string{"the database refused to record the attempt's outcome",
				"value overflows numeric format", "[SQLSTATE 22003]"}, ""}},
		{"go: collect merge of a string", `"handler": "go_string", "collect": "merge"`,
			goHandler("just a string", nil),
			want{"error", "contract_failure", []string{"the database refused to record the attempt's outcome",
				"collect = merge needs a JSON object output, got string", "[SQLSTATE 22023]"}, ""}},
		{"go: NUL in a failure's message and class", `"handler": "go_err_nul"`,
			goHandler(nil, steps.Fail("perm\x00anent\xff", errors.New("it broke\x00here"))),
			want{"error", "perm\ufffdanent\ufffd", []string{"it broke\ufffdhere"}, ""}},
		// The http handler.
		{"http: NUL in a JSON body", `"handler": "http", "input": {"url": "` + srv.URL + `/nul"}`, nil,
			want{"error", "contract_failure", []string{"handler output: $.body.s: a string holds the NUL"}, ""}},
		{"http: NUL in a JSON body's member name", `"handler": "http", "input": {"url": "` + srv.URL + `/nul-key"}`, nil,
			want{"error", "contract_failure", []string{"handler output: $.body (a member name): a string holds the NUL"}, ""}},
		{"http: invalid UTF-8 in a JSON body", `"handler": "http", "input": {"url": "` + srv.URL + `/utf8"}`, nil,
			want{"complete", "", nil, ""}},
		{"http: a lone surrogate in a JSON body", `"handler": "http", "input": {"url": "` + srv.URL + `/lone"}`, nil,
			want{"complete", "", nil, ""}},
		{"http: a number beyond numeric", `"handler": "http", "input": {"url": "` + srv.URL + `/huge"}`, nil,
			want{"error", "contract_failure", []string{"value overflows numeric format", "[SQLSTATE 22003]"}, ""}},
		{"http: a number below numeric", `"handler": "http", "input": {"url": "` + srv.URL + `/tiny"}`, nil,
			want{"error", "contract_failure", []string{"value overflows numeric format", "[SQLSTATE 22003]"}, ""}},
		{"http: NUL and invalid UTF-8 in a text body", `"handler": "http", "input": {"url": "` + srv.URL + `/text"}`, nil,
			want{"complete", "", nil, ""}},
		// The exec handler.
		{"exec: NUL and invalid UTF-8 on stdout", `"handler": "exec", "input": {"command": ["printf", "a\\000b\\377c"]}`,
			nil, want{"complete", "", nil, ""}},
		{"exec: NUL on stderr of a failed command",
			`"handler": "exec", "input": {"command": ["sh", "-c", "printf 'x\\000y' >&2; exit 3"]}`, nil,
			want{"error", "transient", []string{"x\ufffdy"}, ""}},
	}

	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.reg = steps.NewRegistry()
			require.NoError(t, builtin.Register(b.reg, builtin.Options{AllowExec: true}))
			for i, tc := range cases {
				if tc.handler != nil {
					var fields map[string]string
					require.NoError(t, json.Unmarshal([]byte("{"+tc.step+"}"), &fields))
					b.reg.MustRegister(fields["handler"], tc.handler)
				}
				_ = i
			}
			tasks := make([]int64, len(cases))
			for i, tc := range cases {
				tasks[i] = b.createTask(t, fmt.Sprintf(`{"name": "c%d", "steps": [{"name": "s", %s,
					"retry": {"max_attempts": 1}}]}`, i, tc.step))
			}
			b.start(t, stepready.Config{Dispatch: mode, PollInterval: time.Minute})
			for i, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					status := b.waitTask(t, tasks[i], 30*time.Second, "complete", "error")
					var state string
					var attempts int
					var class, msg, output, starts *string
					require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT s.state, s.attempts,
						s.last_error ->> 'class', s.last_error ->> 'message', s.output::text,
						(SELECT string_agg(e.event, ',' ORDER BY e.id) FROM stepready.step_events e
						  WHERE e.task_id = s.task_id AND e.event IN ('attempt.started', 'lease.expired'))
						FROM stepready.steps s WHERE s.task_id = $1`, tasks[i]).
						Scan(&state, &attempts, &class, &msg, &output, &starts))
					require.Equal(t, tc.want.state, state, "status %s, last_error %v %v", status, deref(class), deref(msg))
					require.Equal(t, 1, attempts)
					require.Equal(t, "attempt.started", deref(starts), "one attempt, never reaped")
					if tc.want.class != "" {
						require.Equal(t, tc.want.class, deref(class))
					}
					for _, m := range tc.want.msg {
						require.Contains(t, deref(msg), m)
					}
					if tc.want.output != "" {
						require.JSONEq(t, tc.want.output, deref(output))
					}
					if state == "complete" {
						require.NotContains(t, deref(output), `\u0000`)
					}
				})
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
