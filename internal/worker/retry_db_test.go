package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// RELIABILITY #4: a result write that fails because the connection was lost is retried until it succeeds (the
// write is fenced, so a retry after a commit whose reply was lost changes nothing); an error that retrying cannot
// fix, a closed pool or a cancelled context stops at once.
func TestRetryDBRetriesLostConnectionsOnly(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "server says " + code} }
	cases := []struct {
		name      string
		err       error
		failFirst int // fn fails this many times with err, then succeeds
		wantCalls int
		wantErr   bool
	}{
		{"connection failure 08006", pg("08006"), 3, 4, false},
		{"admin shutdown 57P01", pg("57P01"), 2, 3, false},
		{"crash shutdown 57P02", pg("57P02"), 1, 2, false},
		{"cannot connect now 57P03", pg("57P03"), 1, 2, false},
		{"serialization failure 40001", pg("40001"), 1, 2, false},
		{"deadlock 40P01", pg("40P01"), 1, 2, false},
		{"reset connection (no server error)", fmt.Errorf("write: %w", io.ErrUnexpectedEOF), 3, 4, false},
		{"unique violation is not retried", pg("23505"), 5, 1, true},
		{"invalid parameter is not retried", pg("22023"), 5, 1, true},
		{"closed pool stops", errors.New("closed pool"), 5, 1, true},
		{"cancelled context stops", context.Canceled, 5, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := retryDB(context.Background(), func() error {
				calls++
				if calls <= tc.failFirst {
					return tc.err
				}
				return nil
			})
			require.Equal(t, tc.wantCalls, calls)
			if tc.wantErr {
				require.ErrorIs(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

// A write that keeps failing is retried until its context ends; the error says both what failed and why it
// stopped.
func TestRetryDBStopsWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	lost := &pgconn.PgError{Code: "08006", Message: "connection failure"}
	calls := 0
	err := retryDB(ctx, func() error { calls++; return lost })
	require.ErrorIs(t, err, lost)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.GreaterOrEqual(t, calls, 2, "retried while the context lived")
}
