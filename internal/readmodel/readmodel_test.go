package readmodel

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQueriesParse(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"tasks", "task", "steps", "events", "reasons_task", "simulate"} {
		require.NotEmpty(t, query(name), name)
	}
	require.Panics(t, func() { query("nope") })
	require.Panics(t, func() { mustParseQueries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n") })
	require.Equal(t, map[string]string{"a": "SELECT 1;", "b": "SELECT 2;"},
		mustParseQueries("-- header\n-- name: a\nSELECT 1;\n\n-- name: b\nSELECT 2;\n"))
}
