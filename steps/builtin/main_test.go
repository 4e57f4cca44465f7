package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// run runs one attempt of a step with the given input through h and returns its output encoded as JSON.
func run(ctx context.Context, h steps.Handler, input string, attempt int) (string, error) {
	step := &steps.Step{ID: 1, TaskID: 1, Name: "test-step", Attempt: attempt}
	if input != "" {
		step.Input = json.RawMessage(input)
	}
	out, err := h.Handle(ctx, step)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// requireClass checks that err is a classified failure of the given class and returns it.
func requireClass(t *testing.T, err error, class string) *steps.Error {
	t.Helper()
	require.Error(t, err)
	fail, ok := steps.AsError(err)
	require.True(t, ok, "error is not a *steps.Error: %v", err)
	require.Equal(t, class, fail.Class, "error: %v", err)
	return fail
}

// requireBadInput checks that err is a permanent input error whose message names field.
func requireBadInput(t *testing.T, err error, field string) {
	t.Helper()
	requireClass(t, err, steps.ClassPermanent)
	var inputErr *steps.InputError
	require.True(t, errors.As(err, &inputErr), "not an input error: %v", err)
	require.Equal(t, "test-step", inputErr.Step)
	require.Contains(t, err.Error(), `"`+field+`"`)
}
