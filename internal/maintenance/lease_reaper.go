package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stepready/stepready/internal/store"
)

// LeaseReaperIntervalDefault is how often the elected instance reaps expired leases.
const LeaseReaperIntervalDefault = 10 * time.Second

// LeaseReaperConfig configures a LeaseReaper. Zero values take the defaults.
type LeaseReaperConfig struct {
	// Interval between rounds (default LeaseReaperIntervalDefault; Off turns reaping off, which leaves the
	// attempts of dead workers in flight until another instance reaps them). An attempt whose worker died is
	// retried within its lease plus Interval, so Interval should be shorter than the lease.
	Interval time.Duration
	// Batch is the most leases one reap_expired_leases call handles (default BatchDefault). A round calls it
	// until a batch comes back short, so any backlog is reaped in one round.
	Batch int
	// Timeout bounds one batch (default TimeoutDefault).
	Timeout time.Duration
}

// LeaseReaper fails the attempts whose lease expired (their worker died or lost the database) with class
// stalled, and hands claimed-but-never-started steps back uncharged: stepready.reap_expired_leases, on the
// elected instance of each round.
type LeaseReaper struct {
	env Env
	cfg LeaseReaperConfig
}

// NewLeaseReaper checks cfg and builds the service.
func NewLeaseReaper(env Env, cfg LeaseReaperConfig) (*LeaseReaper, error) {
	cfg.Interval = cmp.Or(cfg.Interval, LeaseReaperIntervalDefault)
	cfg.Batch = cmp.Or(cfg.Batch, BatchDefault)
	cfg.Timeout = cmp.Or(cfg.Timeout, TimeoutDefault)
	if err := errors.Join(env.validate(), checkInterval("LeaseReaperConfig.Interval", cfg.Interval),
		checkBatch("LeaseReaperConfig", cfg.Batch, cfg.Timeout)); err != nil {
		return nil, fmt.Errorf("maintenance: lease reaper: %w", err)
	}
	return &LeaseReaper{env: env.withDefaults(), cfg: cfg}, nil
}

func (r *LeaseReaper) name() string         { return "lease reaper" }
func (r *LeaseReaper) every() time.Duration { return r.cfg.Interval }

func (r *LeaseReaper) round(ctx context.Context) (time.Duration, error) {
	n, err := r.RunOnce(ctx)
	return logRound(r.env.Logger, r.name(), "reaped expired leases", n, err)
}

// RunOnce runs one round if this instance wins its election: batches until one comes back short. It returns
// how many steps were reaped (0 when another instance holds the round).
func (r *LeaseReaper) RunOnce(ctx context.Context) (int, error) {
	return electedDrain(ctx, r.env, lockLeaseReaper, r.name(), r.cfg.Batch, r.cfg.Timeout,
		func(ctx context.Context, limit int) (int, error) {
			k, err := store.ReapExpiredLeases(ctx, r.env.Pool, limit)
			r.env.Metrics.Reaped(k)
			return k, err
		})
}
