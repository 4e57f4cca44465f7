package stepready_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
)

// Config.Queues (SPEC §21): empty takes ["default"]; each must be a queue name as steps.queue takes it, listed once.
func TestConfigQueues(t *testing.T) {
	t.Parallel()
	reg := steps.NewRegistry()
	require.NoError(t, stepready.Config{Registry: reg}.Validate())
	require.Equal(t, []string{"default"}, stepready.QueuesDefault())
	require.NoError(t, stepready.Config{Registry: reg, Queues: []string{"default", "high-priority", "a_b|c"}}.Validate())
	for _, c := range []struct {
		queues []string
		value  string
		want   string
	}{
		{[]string{"Media"}, `"Media"`, "must be a queue name"},
		{[]string{""}, `""`, "must be a queue name"},
		{[]string{"a", "b", "a"}, `"a"`, "is listed twice"},
		{[]string{"x-"}, `"x-"`, "must be a queue name"},
	} {
		err := stepready.Config{Registry: reg, Queues: c.queues}.Validate()
		var ce *stepready.ConfigError
		require.True(t, errors.As(err, &ce), "%v: %v", c.queues, err)
		require.Equal(t, "Queues", ce.Field)
		require.Equal(t, c.value, ce.Value)
		require.Contains(t, ce.Problem, c.want)
	}
}
