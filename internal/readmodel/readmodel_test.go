package readmodel

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQueriesParse(t *testing.T) {
	for _, name := range []string{"tasks", "task", "steps", "task_list", "task_show_steps", "explain_reasons_task"} {
		require.NotEmpty(t, Query(name), name)
	}
	require.Panics(t, func() { Query("nope") })
	require.Panics(t, func() { mustParseQueries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n") })
	require.Equal(t, map[string]string{"a": "SELECT 1;", "b": "SELECT 2;"},
		mustParseQueries("-- header\n-- name: a\nSELECT 1;\n\n-- name: b\nSELECT 2;\n"))
}
