package builtin

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
)

func TestNoop(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, input, want string
	}{
		{"Empty", "", `{}`},
		{"Object", `{"a": 1, "b": [true, null, "x"]}`, `{"a": 1, "b": [true, null, "x"]}`},
		{"BigNumberKeepsDigits", `{"id": 12345678901234567890123}`, `{"id": 12345678901234567890123}`},
		{"Array", `[1, 2]`, `[1, 2]`},
		{"Null", `null`, `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := run(context.Background(), steps.HandlerFunc(handleNoop), tc.input, 1)
			require.NoError(t, err)
			require.JSONEq(t, tc.want, out)
		})
	}
}
