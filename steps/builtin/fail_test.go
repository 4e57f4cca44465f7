package builtin

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
)

func TestFail(t *testing.T) {
	t.Parallel()
	h := steps.HandlerFunc(handleFail)

	for _, tc := range []struct {
		name           string
		input          string
		attempt        int
		wantOutput     string // success expected when set
		wantClass      string
		wantMsg        string
		wantRetryAfter time.Duration // -1: none
	}{
		{"EmptySucceeds", ``, 1, `{"attempts": 1}`, "", "", -1},
		{"ZeroTimesSucceeds", `{"times": 0}`, 1, `{"attempts": 1}`, "", "", -1},
		{"FirstOfTwoFails", `{"times": 2}`, 1, "", steps.ClassTransient, "fail handler: attempt 1 of 2 fails", -1},
		{"SecondOfTwoFails", `{"times": 2}`, 2, "", steps.ClassTransient, "fail handler: attempt 2 of 2 fails", -1},
		{"ThirdSucceeds", `{"times": 2}`, 3, `{"attempts": 3}`, "", "", -1},
		{"LaterSucceeds", `{"times": 2}`, 7, `{"attempts": 7}`, "", "", -1},
		{"Class", `{"times": 1, "class": "permanent"}`, 1, "", steps.ClassPermanent, "attempt 1 of 1 fails", -1},
		{"CustomClass", `{"times": 1, "class": "flaky_vendor"}`, 1, "", "flaky_vendor", "attempt 1 of 1", -1},
		{"Message", `{"times": 1, "message": "boom"}`, 1, "", steps.ClassTransient, "boom", -1},
		{"RetryAfter", `{"times": 1, "retry_after_ms": 1500}`, 1, "", steps.ClassTransient, "attempt 1", 1500 * time.Millisecond},
		{"RetryAfterZero", `{"times": 1, "retry_after_ms": 0, "class": "rate_limited"}`, 1, "", steps.ClassRateLimited, "attempt 1", 0},
		{"RetryAfterIgnoredOnSuccess", `{"times": 1, "retry_after_ms": 1500}`, 2, `{"attempts": 2}`, "", "", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := run(context.Background(), h, tc.input, tc.attempt)
			if tc.wantOutput != "" {
				require.NoError(t, err)
				require.JSONEq(t, tc.wantOutput, out)
				return
			}
			fail := requireClass(t, err, tc.wantClass)
			require.ErrorContains(t, err, tc.wantMsg)
			if tc.wantRetryAfter < 0 {
				require.Nil(t, fail.RetryAfter)
			} else {
				require.NotNil(t, fail.RetryAfter)
				require.Equal(t, tc.wantRetryAfter, *fail.RetryAfter)
			}
		})
	}

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name, input, field string
		}{
			{"NegativeTimes", `{"times": -1}`, "times"},
			{"NegativeRetryAfter", `{"times": 1, "retry_after_ms": -5}`, "retry_after_ms"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				_, err := run(context.Background(), h, tc.input, 1)
				requireBadInput(t, err, tc.field)
			})
		}
		_, err := run(context.Background(), h, `{"time": 2}`, 1)
		requireClass(t, err, steps.ClassPermanent)
		require.ErrorContains(t, err, `unknown field "time"`)
	})
}
