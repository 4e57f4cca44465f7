package readmodel

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Policy is a retry policy: a preset of stepready.retry_policies, or one with fields overridden.
type Policy struct {
	Name        string   `json:"name"`
	MaxAttempts *int32   `json:"max_attempts"`
	Retryable   *bool    `json:"retryable"`
	Backoff     *string  `json:"backoff"`
	BaseDelayMs *int64   `json:"base_delay_ms"`
	Multiplier  *float64 `json:"multiplier"`
	MaxDelayMs  *int64   `json:"max_delay_ms"`
	Jitter      *float64 `json:"jitter"`
}

func scanPolicy(row pgx.Row, p *Policy) error {
	return row.Scan(&p.Name, &p.MaxAttempts, &p.Retryable, &p.Backoff, &p.BaseDelayMs, &p.Multiplier, &p.MaxDelayMs,
		&p.Jitter)
}

// Policies returns the retry presets, by name.
func Policies(ctx context.Context, q Querier) ([]Policy, error) {
	return collect(ctx, q, "policies", scanPolicy)
}

// SimulatedAttempt is one row of a policy's timeline: attempt k starts at StartsAtMs (after the first attempt's
// start, attempts taking no time) and, if it fails, either a retry follows after DelayMs or the step ends.
type SimulatedAttempt struct {
	Attempt      int32    `json:"attempt"`
	StartsAtMs   int64    `json:"starts_at_ms"`
	Retry        bool     `json:"retry"`
	BackoffMs    *int64   `json:"backoff_delay_ms"`
	JitterSample *float64 `json:"jitter_sample"`
	DelayMs      *int64   `json:"delay_ms"`
	CumulativeMs *int64   `json:"cumulative_ms"`
}

// Simulation is a policy with its retry timeline.
type Simulation struct {
	Policy Policy `json:"policy"`
	// Overridden is true when fields of the preset named in Policy were replaced.
	Overridden bool               `json:"overridden"`
	Timeline   []SimulatedAttempt `json:"timeline"`
}

// PolicyOverrides replaces fields of a preset for a simulation; nil fields keep the preset's value.
type PolicyOverrides struct {
	MaxAttempts *int32
	Retryable   *bool
	Backoff     *string
	BaseDelayMs *int64
	Multiplier  *float64
	MaxDelayMs  *int64
	// Uncapped sets max_delay_ms to NULL (no cap).
	Uncapped bool
	Jitter   *float64
}

func (o PolicyOverrides) any() bool {
	return o.MaxAttempts != nil || o.Retryable != nil || o.Backoff != nil || o.BaseDelayMs != nil ||
		o.Multiplier != nil || o.MaxDelayMs != nil || o.Uncapped || o.Jitter != nil
}

// SimulateOptions shapes a simulation.
type SimulateOptions struct {
	Overrides PolicyOverrides
	// Seed, when set, seeds PostgreSQL's random() (-1..1) and the jitter samples are drawn from it; nil: every
	// sample is 0 (no jitter: the longest delays).
	Seed *float64
	// MaxAttempts bounds the timeline (required, > 0).
	MaxAttempts int
}

// Simulate computes the retry timeline of preset name (with opts' overrides) with the database's own functions
// (retry_eligible, backoff_delay_ms and fail_step's jitter formula), so the timeline is what runs. Failures are
// assumed retryable by class; the circuit breaker and Retry-After are not simulated. A missing preset is an error
// wrapping ErrNotFound. q should be a transaction when Seed is set (setseed and random() must share a session).
func Simulate(ctx context.Context, q Querier, name string, opts SimulateOptions) (*Simulation, error) {
	if opts.MaxAttempts <= 0 {
		return nil, fmt.Errorf("readmodel: Simulate: MaxAttempts %d: must be more than 0", opts.MaxAttempts)
	}
	o := opts.Overrides
	sim := &Simulation{Overridden: o.any()}
	err := scanPolicy(q.QueryRow(ctx, query("policy"), name, o.MaxAttempts, o.Retryable, o.Backoff, o.BaseDelayMs,
		o.Multiplier, o.MaxDelayMs, o.Uncapped, o.Jitter), &sim.Policy)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFoundf("no retry policy %q (see `scheduler policy list`)", name)
	}
	if err != nil {
		return nil, fmt.Errorf("readmodel: policy: %w", err)
	}
	if opts.Seed != nil {
		if _, err := q.Exec(ctx, query("setseed"), *opts.Seed); err != nil {
			return nil, fmt.Errorf("readmodel: setseed: %w", err)
		}
	}
	p := sim.Policy
	sim.Timeline, err = collect(ctx, q, "simulate", func(row pgx.Row, a *SimulatedAttempt) error {
		return row.Scan(&a.Attempt, &a.StartsAtMs, &a.Retry, &a.BackoffMs, &a.JitterSample, &a.DelayMs, &a.CumulativeMs)
	}, p.MaxAttempts, p.Retryable, p.Backoff, p.BaseDelayMs, p.Multiplier, p.MaxDelayMs, p.Jitter, opts.Seed != nil,
		opts.MaxAttempts)
	if err != nil {
		return nil, err
	}
	return sim, nil
}
