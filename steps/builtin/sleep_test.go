package builtin

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	h := steps.HandlerFunc(handleSleep)

	t.Run("Sleeps", func(t *testing.T) {
		t.Parallel()
		for _, ms := range []string{"0", "1"} {
			out, err := run(context.Background(), h, `{"ms": `+ms+`}`, 1)
			require.NoError(t, err)
			require.JSONEq(t, `{"slept_ms": `+ms+`}`, out)
		}
	})

	t.Run("Cancelled", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := run(ctx, h, `{"ms": 3600000}`, 1)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "sleep handler")
		_, classified := steps.AsError(err)
		require.False(t, classified, "a cancelled attempt is the context's error, for the daemon to hand back")
	})

	t.Run("Deadline", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		_, err := run(ctx, h, `{"ms": 3600000}`, 1)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name, input, field string
		}{
			{"Missing", `{}`, "ms"},
			{"Empty", ``, "ms"},
			{"Negative", `{"ms": -1}`, "ms"},
			{"TooLarge", `{"ms": 9223372036854775807}`, "ms"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				_, err := run(context.Background(), h, tc.input, 1)
				requireBadInput(t, err, tc.field)
			})
		}
	})

	t.Run("UndecodableInput", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name, input, wantMsg string
		}{
			{"UnknownField", `{"msec": 5}`, `unknown field "msec"`},
			{"WrongType", `{"ms": "5"}`, "ms"},
			{"NotAnObject", `[5]`, "cannot unmarshal array"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				_, err := run(context.Background(), h, tc.input, 1)
				requireClass(t, err, steps.ClassPermanent)
				require.ErrorContains(t, err, "step test-step: bad input")
				require.ErrorContains(t, err, tc.wantMsg)
			})
		}
	})
}
