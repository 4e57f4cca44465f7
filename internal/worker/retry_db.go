package worker

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// retryDB runs fn until it succeeds, fails with an error that retrying cannot fix, or ctx ends. It retries
// what a lost or restarted connection produces (network errors, SQLSTATE class 08, admin shutdown) and
// serialization failures, with capped exponential backoff. Recording calls are fenced by the attempt's token, so
// repeating one whose first try did commit changes nothing.
func retryDB(ctx context.Context, fn func() error) error {
	delay := 50 * time.Millisecond
	for {
		err := fn()
		if err == nil || !retryableDBError(err) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
		delay = min(delay*2, 2*time.Second)
	}
}

func retryableDBError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), pgErr.Code == "57P01", pgErr.Code == "57P02",
			pgErr.Code == "57P03", pgErr.Code == "40001", pgErr.Code == "40P01":
			return true
		}
		return false
	}
	// pgxpool reports a closed pool with a plain error: the daemon is going away, stop.
	if strings.Contains(err.Error(), "closed pool") {
		return false
	}
	// No server error: the connection itself failed (reset, refused, EOF).
	return true
}
