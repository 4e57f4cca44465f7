package steps_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
)

// Step.Dep decodes one parent's output from Deps; a parent without a member, or an output that does not decode,
// is a permanent failure naming the step and the parent.
func TestStepDep(t *testing.T) {
	t.Parallel()
	s := &steps.Step{Name: "report", Deps: json.RawMessage(`{"list": {"files": ["a", "b"]}, "n": 3, "none": null}`)}
	var list struct {
		Files []string `json:"files"`
	}
	require.NoError(t, s.Dep("list", &list))
	require.Equal(t, []string{"a", "b"}, list.Files)
	var n int
	require.NoError(t, s.Dep("n", &n))
	require.Equal(t, 3, n)
	var none *int
	require.NoError(t, s.Dep("none", &none), "a parent whose output is null has a member")
	require.Nil(t, none)

	err := s.Dep("skipped", &n)
	require.ErrorIs(t, err, steps.ErrNoDep)
	var depErr *steps.DepError
	require.ErrorAs(t, err, &depErr)
	require.Equal(t, "step report: deps.skipped: no such member in deps (not a direct parent, or skipped)", depErr.Error())
	e, ok := steps.AsError(err)
	require.True(t, ok)
	require.Equal(t, steps.ClassPermanent, e.Class)

	err = s.Dep("list", &n)
	var typeErr *json.UnmarshalTypeError
	require.True(t, errors.As(err, &typeErr), "the decoding error is the cause: %v", err)

	require.ErrorIs(t, (&steps.Step{Name: "root"}).Dep("x", &n), steps.ErrNoDep, "no deps at all")
}
