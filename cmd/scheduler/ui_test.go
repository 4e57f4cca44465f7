package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Console actions need a token: `scheduler ui` and `scheduler run` refuse --ui-allow-actions without one (exit 2).
func TestUIActionsNeedAToken(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"ui", "--ui-allow-actions", "--database-url", "postgres://nowhere/x"},
		{"run", "--ui-allow-actions", "--ui-addr", "127.0.0.1:0", "--database-url", "postgres://nowhere/x"},
	} {
		_, _, err := executeIsolated(context.Background(), t, args...)
		require.ErrorContains(t, err, "--ui-allow-actions needs a token", args)
		require.Equal(t, 2, exitCode(err), args)
	}
}
