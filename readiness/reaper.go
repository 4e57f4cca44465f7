package readiness

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepready/stepready/internal/metrics"
	"github.com/stepready/stepready/internal/store"
)

// ReaperLockKey is the transaction advisory lock that elects the one reaper of each round ("StepRep\x01").
const ReaperLockKey int64 = 0x5374_6570_5265_7001

// Reaper calls reap_expired_leases every Interval on whichever instance takes the advisory lock first, so
// exactly one instance reaps at a time however many daemons run.
type Reaper struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Interval between rounds. Required (> 0).
	Interval time.Duration
	// Logger receives the reaper's logs. Required.
	Logger *slog.Logger
	// Metrics counts reaped steps (nil: none).
	Metrics *metrics.Metrics
}

// Run reaps until ctx is done.
func (r *Reaper) Run(ctx context.Context) error {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := r.ReapOnce(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.Logger.Error("readiness: reap expired leases", slog.Any("error", err))
			}
			continue
		}
		if n > 0 {
			r.Logger.Info("readiness: reaped expired leases", slog.Int("steps", n))
		}
	}
}

// ReapOnce runs one round if this instance wins the lock; it returns how many steps were reaped.
func (r *Reaper) ReapOnce(ctx context.Context) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, r.Pool, func(tx pgx.Tx) error {
		var leader bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, ReaperLockKey).Scan(&leader); err != nil {
			return fmt.Errorf("readiness: reaper election: %w", err)
		}
		if !leader {
			r.Metrics.ResetQueueBacklog()
			return nil
		}
		var err error
		if n, err = store.ReapExpiredLeases(ctx, tx); err != nil {
			return err
		}
		// The elected instance also exports the backlog (queue_stats), so that operators can alert and
		// autoscale on the scheduling lag.
		stats, err := store.QueueStats(ctx, tx)
		if err != nil {
			return err
		}
		r.Metrics.ResetQueueBacklog()
		for _, s := range stats {
			r.Metrics.QueueBacklog(s.Queue, s.Ready, s.InFlight, s.WaitingForRetry, s.DueWithinMinute, s.OldestReadySeconds)
		}
		// And what flow control holds back, by reason only (a label per key would be unbounded).
		flow, err := store.FlowStatus(ctx, tx)
		if err != nil {
			return err
		}
		keys, steps := map[string]int{}, map[string]int{}
		for _, k := range flow {
			if k.Blocked != "" {
				keys[k.Blocked]++
				steps[k.Blocked] += k.Waiting
			}
		}
		for _, reason := range []string{"concurrency_limited", "rate_limited"} {
			r.Metrics.FlowBlocked(reason, keys[reason], steps[reason])
		}
		return nil
	})
	r.Metrics.Reaped(n)
	return n, err
}
