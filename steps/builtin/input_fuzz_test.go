package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
)

// FuzzBuiltinInputs feeds arbitrary input to the decoders of every built-in handler (noop, sleep, fail, http,
// sql, exec), which run before anything is slept, sent, queried or started. Each either accepts the input or
// returns the clear error a user sees: a permanent *steps.Error wrapping a *steps.InputError that names the step
// (and, for a value it rejects, the field). None panics. The seed corpus is in testdata/fuzz/FuzzBuiltinInputs.
func FuzzBuiltinInputs(f *testing.F) {
	for _, seed := range []string{``, `null`, `{}`, `[]`, `"x"`, `{"ms": 5}`, `{"times": 2, "class": "timeout"}`,
		`{"url": "http://example.test/a?b=1", "query": {"page": 2, "tags": ["a", "b"], "drop": null}}`,
		`{"query": "SELECT $1::int", "args": [1]}`, `{"command": ["true"]}`, `{"nope": 1}`, `{`} {
		f.Add([]byte(seed))
	}
	h := newHTTPHandler(nil)
	f.Fuzz(func(t *testing.T, input []byte) {
		step := &steps.Step{ID: 1, TaskID: 1, Name: "fuzzed", Attempt: 1, Input: input}
		check := func(handler string, err error) {
			t.Helper()
			if err == nil {
				return
			}
			e, ok := steps.AsError(err)
			require.True(t, ok, "%s: a classified error, got %T %v", handler, err, err)
			require.Equal(t, steps.ClassPermanent, e.Class, "%s: bad input is permanent: %v", handler, err)
			var in *steps.InputError
			require.True(t, errors.As(err, &in), "%s: an input error, got %v", handler, err)
			require.True(t, strings.HasPrefix(err.Error(), "permanent: step fuzzed: bad input: "),
				"%s: the message names the step: %v", handler, err)
		}

		out, err := handleNoop(context.Background(), step)
		check("noop", err)
		if err == nil {
			b, err := json.Marshal(out)
			require.NoError(t, err)
			require.True(t, json.Valid(b), "noop: the output is JSON")
		}

		sleepIn, err := decodeSleepInput(step)
		check("sleep", err)
		if err == nil {
			require.NotNil(t, sleepIn.MS)
			require.True(t, *sleepIn.MS >= 0 && *sleepIn.MS <= maxSleepMS, "sleep: %d ms", *sleepIn.MS)
		}

		failIn, err := decodeFailInput(step)
		check("fail", err)
		if err == nil {
			require.GreaterOrEqual(t, failIn.Times, 0)
			// Running it decides from the input alone: it fails with the class asked for, or succeeds.
			_, runErr := handleFail(context.Background(), step)
			if failIn.Times >= 1 {
				e, ok := steps.AsError(runErr)
				require.True(t, ok, "fail: %v", runErr)
				require.False(t, e.RetryAfter != nil && *e.RetryAfter < 0, "fail: a negative delay")
			} else {
				require.NoError(t, runErr)
			}
		}

		httpIn, req, err := h.decodeRequest(context.Background(), step)
		check("http", err)
		if err == nil {
			require.NotNil(t, req)
			require.Contains(t, []string{"http", "https"}, req.URL.Scheme)
			require.NotEmpty(t, req.URL.Host)
			for _, s := range httpIn.Expect {
				require.True(t, s >= 100 && s <= 599, "http: expect %d", s)
			}
		}

		query, args, err := decodeSQLInput(step)
		check("sql", err)
		if err == nil {
			require.NotEmpty(t, query)
			for _, a := range args {
				if a != nil {
					require.IsType(t, "", a, "sql: parameters are sent as text")
				}
			}
		}

		execIn, err := decodeExecInput(step)
		check("exec", err)
		if err == nil {
			require.NotEmpty(t, execIn.Command)
			require.NotEmpty(t, execIn.Command[0])
		}
	})
}
