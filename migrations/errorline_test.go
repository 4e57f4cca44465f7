package migrations

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestErrorLine(t *testing.T) {
	t.Parallel()
	contents := "-- é comment\nSELECT 1;\nSELEC 2;\n"
	at := func(position int32) error {
		return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "42601", Position: position})
	}

	require.Equal(t, ", line 1", errorLine(contents, at(1)))
	require.Equal(t, ", line 2", errorLine(contents, at(14)), "positions count characters, not bytes")
	require.Equal(t, ", line 3", errorLine(contents, at(24)))
	require.Empty(t, errorLine(contents, at(0)), "no position, no line")
	require.Empty(t, errorLine(contents, errors.New("not from the server")))
}
