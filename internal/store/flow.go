package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// FlowKey is one row of stepready.flow_status: a flow control key with its limits, what is in flight and what
// waits (SPEC §14).
type FlowKey struct {
	// Key is the concurrency or rate key.
	Key string `json:"key"`
	// ConcurrencyLimit is the key's concurrency limit: the override, else the steps' own (nil: none).
	ConcurrencyLimit *int `json:"concurrency_limit"`
	// InFlight is how many slots of the key are taken: its steps enqueued or in progress, and those an operator
	// moved out of flight while their attempt may still run (an orphaned lease not expired).
	InFlight int `json:"in_flight"`
	// RateLimit and RatePeriodMS are the key's rate limit, starts per period (nil: none).
	RateLimit    *int   `json:"rate_limit"`
	RatePeriodMS *int64 `json:"rate_period_ms"`
	// Tokens is what is left in the key's bucket now (fractional: the refill is continuous).
	Tokens *float64 `json:"tokens"`
	// NextTokenAt is when the next start is allowed, when no token is left.
	NextTokenAt *time.Time `json:"next_token_at"`
	// Waiting is how many steps of the key are claimable apart from flow control, counted up to a share of a
	// fixed budget (WaitingCapped: more than Waiting wait).
	Waiting int `json:"waiting"`
	// WaitingCapped says that the key has more than Waiting steps waiting: flow_status counts at most 10,000
	// waiting steps in all (the SQL function stepready._read_budget), each key up to an equal share of them (at
	// least 1). Show Waiting as a lower bound ("100+").
	WaitingCapped bool `json:"waiting_capped"`
	// Overridden says that an operator override (stepready.flow_limits) applies.
	Overridden bool `json:"overridden"`
	// Blocked is "concurrency_limited", "rate_limited" or empty.
	Blocked string `json:"blocked,omitempty"`
}

// FlowStatus reads every flow control key at the database's now, ordered by key.
func FlowStatus(ctx context.Context, db DBTX) ([]FlowKey, error) {
	rows, err := db.Query(ctx, `SELECT key, concurrency_limit, in_flight, rate_limit, rate_period_ms, tokens,
		next_token_at, waiting, overridden, COALESCE(blocked, ''), waiting_capped FROM stepready.flow_status()`)
	if err != nil {
		return nil, fmt.Errorf("store: flow status: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FlowKey, error) {
		var k FlowKey
		err := r.Scan(&k.Key, &k.ConcurrencyLimit, &k.InFlight, &k.RateLimit, &k.RatePeriodMS, &k.Tokens,
			&k.NextTokenAt, &k.Waiting, &k.Overridden, &k.Blocked, &k.WaitingCapped)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: flow status: %w", err)
	}
	return keys, nil
}

// FlowLimit is an operator override of a key's limits; nil fields keep what is stored.
type FlowLimit struct {
	// Concurrency is the concurrency limit (>= 1).
	Concurrency *int
	// Rate is the rate limit (>= 1 starts per Period).
	Rate *int
	// Period is the rate limit's period (>= 1 ms).
	Period *time.Duration
}

// SetFlowLimit stores an override through stepready.set_flow_limit; it takes effect at the next claim.
func SetFlowLimit(ctx context.Context, db DBTX, key string, l FlowLimit) error {
	var periodMS *int64
	if l.Period != nil {
		ms := l.Period.Milliseconds()
		periodMS = &ms
	}
	if _, err := db.Exec(ctx, `SELECT stepready.set_flow_limit($1, $2, $3, $4)`, key, l.Concurrency, l.Rate,
		periodMS); err != nil {
		return fmt.Errorf("store: set flow limit %q: %w", key, err)
	}
	return nil
}

// ClearFlowLimit removes a key's override; it reports whether there was one.
func ClearFlowLimit(ctx context.Context, db DBTX, key string) (bool, error) {
	var had bool
	if err := db.QueryRow(ctx, `SELECT stepready.clear_flow_limit($1)`, key).Scan(&had); err != nil {
		return false, fmt.Errorf("store: clear flow limit %q: %w", key, err)
	}
	return had, nil
}

// PruneFlowState deletes at most limit flow_state rows of idle keys (stepready.prune_flow_state at the database's
// now) and returns how many it deleted.
func PruneFlowState(ctx context.Context, db DBTX, limit int) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT stepready.prune_flow_state(now(), $1)`, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: prune idle flow keys: %w", err)
	}
	return n, nil
}
