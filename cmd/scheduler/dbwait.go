package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/stepready/stepready/internal/store"
)

// `scheduler run` and `scheduler ui` wait for the database at start (issue 27): started at boot before
// PostgreSQL, or during its restart, they try to connect with backoff, logging each failed try with its error,
// until the database answers, --wait-for-db has passed (exit 1), or a signal stops them (exit 0). Their HTTP
// listeners are up meanwhile, answering 503 "starting: waiting for the database", so a supervisor sees a process
// that starts rather than one that died. Once connected, a lost database is the pools' business (RELIABILITY #4).

// Backoff between two tries to connect at start: doubled after each failure, from dbWaitBackoffMin up to
// dbWaitBackoffMax (the listener's reconnects use the same kind of schedule).
const (
	dbWaitBackoffMin = 250 * time.Millisecond
	dbWaitBackoffMax = 5 * time.Second
	// dbTryTimeout bounds one try (a host that drops packets would otherwise hold it for the system's TCP
	// timeout); connect_timeout in the URL bounds it further.
	dbTryTimeout = 10 * time.Second
)

// waitingForDatabase is what the health endpoints answer (503) while the database is awaited.
const waitingForDatabase = "starting: waiting for the database"

// errStoppedWaiting is returned by waitForDatabase when its context ended (a signal) before the database answered:
// not a failure.
var errStoppedWaiting = errors.New("stopped while waiting for the database")

// waitBound is the value of --wait-for-db: how long to wait for the database at start, or forever.
type waitBound struct {
	d       time.Duration
	forever bool
}

// waitForever is --wait-for-db's default.
var waitForever = waitBound{forever: true}

// String implements pflag.Value.
func (w *waitBound) String() string {
	if w.forever {
		return "forever"
	}
	return w.d.String()
}

// Set implements pflag.Value: "forever" or a duration of 0 or more.
func (w *waitBound) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "forever") {
		*w = waitForever
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration (30s, 5m; 0 fails at once) or forever: %w", err)
	}
	if d < 0 {
		return fmt.Errorf("%s: must be 0 or more (or forever)", s)
	}
	*w = waitBound{d: d}
	return nil
}

// Type implements pflag.Value.
func (w *waitBound) Type() string { return "duration" }

// registerWaitFlag defines --wait-for-db on fs, default forever.
func registerWaitFlag(fs *pflag.FlagSet, w *waitBound) {
	*w = waitForever
	fs.Var(w, "wait-for-db", "how long to wait for the database at start, trying again with backoff and logging "+
		"each failure: a duration, 0 (fail at once) or forever")
}

// newPool parses url into a pool configuration with at least maxConns connections (unless the URL sets
// pool_max_conns) and creates the pool, which connects lazily: nothing is dialled yet.
func newPool(ctx context.Context, url string, maxConns int32, pooler bool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usagef("--database-url: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = max(cfg.MaxConns, maxConns)
	}
	if pooler {
		// Through a transaction pooler (--poll-only, `scheduler ui`): no named prepared statement
		// (store.UsePoolerQueryMode, unless the URL names default_query_exec_mode).
		store.UsePoolerQueryMode(cfg.ConnConfig)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open the database pool: %w", err)
	}
	return pool, nil
}

// waitForDatabase pings pool until the database answers, trying again with backoff (each failure logged at warn
// with its error and the next delay) for up to bound. It returns errStoppedWaiting when ctx ends first, and a
// failure naming --wait-for-db when the bound has passed (bound 0: the first failure).
func waitForDatabase(ctx context.Context, pool *pgxpool.Pool, bound waitBound, logger *slog.Logger) error {
	begin := time.Now()
	backoff := dbWaitBackoffMin
	for try := 1; ; try++ {
		tryCtx, cancel := context.WithTimeout(ctx, dbTryTimeout)
		err := pool.Ping(tryCtx)
		cancel()
		if err == nil {
			if try > 1 {
				logger.Info("scheduler: connected to the database", slog.Int("tries", try),
					slog.Duration("waited", time.Since(begin).Round(time.Millisecond)))
			}
			return nil
		}
		if ctx.Err() != nil {
			return errStoppedWaiting
		}
		if !bound.forever {
			remaining := bound.d - time.Since(begin)
			if bound.d == 0 {
				return fmt.Errorf("connect to the database: %w", err)
			}
			if remaining <= 0 {
				return fmt.Errorf("connect to the database: still unreachable after %s, %d tries "+
					"(--wait-for-db %s): %w", time.Since(begin).Round(time.Millisecond), try, bound.String(), err)
			}
			backoff = min(backoff, remaining)
		}
		logger.Warn("scheduler: database unreachable; trying again", slog.Int("try", try),
			slog.Duration("retry_in", backoff), slog.String("wait_for_db", bound.String()), slog.Any("error", err))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return errStoppedWaiting
		case <-t.C:
		}
		backoff = min(backoff*2, dbWaitBackoffMax)
	}
}
