package readiness

import (
	"context"
	"log/slog"
	"time"

	"github.com/stepready/stepready/internal/store"
)

// BatchMax bounds one claim statement, whatever the free capacity.
const BatchMax = 100

// Poller claims ready steps into a Dispatcher whenever it is woken.
type Poller struct {
	// DB answers next_claim_at. Required.
	DB store.DBTX
	// Dispatcher receives claims. Required.
	Dispatcher Dispatcher
	// Wake is signalled by the Listener on every notification (nil in poll-only mode).
	Wake <-chan struct{}
	// PollInterval is the fallback wake-up period. Required (> 0).
	PollInterval time.Duration
	// Logger receives the poller's logs. Required.
	Logger *slog.Logger
}

// Run claims until ctx is done. Errors are logged and retried at the next wake-up; a cancelled ctx returns nil.
func (p *Poller) Run(ctx context.Context) error {
	due := time.NewTimer(p.PollInterval)
	defer due.Stop()
	tick := time.NewTicker(p.PollInterval)
	defer tick.Stop()
	for {
		if ctx.Err() != nil {
			return nil
		}
		p.claimAll(ctx)
		p.armTimer(ctx, due)
		select {
		case <-ctx.Done():
			return nil
		case <-p.Wake:
		case <-due.C:
		case <-tick.C:
		case <-p.Dispatcher.Freed():
		}
	}
}

// claimAll claims batches while there is capacity and the last batch came back full.
func (p *Poller) claimAll(ctx context.Context) {
	for ctx.Err() == nil {
		free, err := p.Dispatcher.Free(ctx)
		if err != nil {
			p.logError(ctx, "readiness: free capacity", err)
			return
		}
		if free == 0 {
			return
		}
		limit := min(free, BatchMax)
		n, err := p.Dispatcher.Dispatch(ctx, limit)
		if err != nil {
			p.logError(ctx, "readiness: claim", err)
			return
		}
		if n < limit {
			return
		}
	}
}

// armTimer sets the timer to the earliest future next_attempt_at, measured on the database's clock, capped by
// the poll interval.
func (p *Poller) armTimer(ctx context.Context, t *time.Timer) {
	wait := p.PollInterval
	next, dbNow, err := store.NextClaimAt(ctx, p.DB)
	if err != nil {
		p.logError(ctx, "readiness: next claim time", err)
	} else if next != nil {
		wait = min(max(next.Sub(dbNow), 0), p.PollInterval)
	}
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(wait)
}

func (p *Poller) logError(ctx context.Context, msg string, err error) {
	if ctx.Err() != nil {
		return // shutting down: not an error
	}
	p.Logger.Error(msg, slog.Any("error", err))
}
