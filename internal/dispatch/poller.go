package dispatch

import (
	"context"
	"log/slog"
	"time"

	"github.com/stepready/stepready/internal/store"
)

// BatchMax bounds one claim statement, whatever the free capacity. The fixed cost of a statement (round trip,
// function call, statement trigger) is shared by the steps in it, so a busy daemon gains from large batches (the
// throughput of no-op steps peaked at 1,000 per statement; 2,000 was slower); a claim of 1,000 steps holds their
// row locks for about 20 ms.
const BatchMax = 1000

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
	// ClaimMax bounds one claim below BatchMax (0: BatchMax). Claiming at most half the concurrency at a time
	// keeps two batches in flight, so one is claimed while the other is recorded.
	ClaimMax int
}

// Run claims until ctx is done. Errors are logged and retried at the next wake-up; a cancelled ctx returns nil.
func (p *Poller) Run(ctx context.Context) error {
	due := time.NewTimer(p.PollInterval)
	defer due.Stop()
	tick := time.NewTicker(p.PollInterval)
	defer tick.Stop()
	var why string
	for {
		if ctx.Err() != nil {
			return nil
		}
		// The timer is armed before claiming, never after: a step whose backoff ends between the two statements
		// is then either in the timer (future at the first) or claimed (due at the second). Armed after the
		// claim, such a step would be neither, and would wait for the poll interval. A retry scheduled after
		// the timer query is followed by a freed-capacity signal (this process) or its own daemon's wake-up.
		// The dispatchers read next_claim_at in the claim's own transaction, before the claim, so arming costs
		// no round trip of its own when there is capacity to claim.
		wait := p.claimAll(ctx, due, why == "due timer")
		p.Logger.Debug("dispatch: waiting", slog.Duration("next_due_in", wait))
		select {
		case <-ctx.Done():
			return nil
		case <-p.Wake:
			why = "notification"
		case <-due.C:
			why = "due timer"
		case <-tick.C:
			why = "poll interval"
		case <-p.Dispatcher.Freed():
			why = "capacity freed"
		}
		p.Logger.Debug("dispatch: woken", slog.String("by", why))
	}
}

// claimAll claims batches while there is capacity and the last batch came back full, and arms the timer: from
// the first claim (which reads next_claim_at before claiming), or on its own when nothing was claimed.
//
// dueTimer says the due timer woke the poller. With no free capacity it then still runs a claim of zero steps:
// the claim's prologue ends the durable sleeps and signal timeouts that are due (sql/059_signals.sql), so a wait
// ends on time while every worker slot of this daemon is busy, and the dependents go to whichever daemon has room.
func (p *Poller) claimAll(ctx context.Context, timer *time.Timer, dueTimer bool) time.Duration {
	armed := false
	var wait time.Duration
	for ctx.Err() == nil {
		free, err := p.Dispatcher.Free(ctx)
		if err != nil {
			p.logError(ctx, "dispatch: free capacity", err)
			break
		}
		if free == 0 {
			if dueTimer && !armed {
				_, due, err := p.Dispatcher.Dispatch(ctx, 0)
				if err != nil {
					p.logError(ctx, "dispatch: claim", err)
					break
				}
				wait, armed = p.setTimer(timer, due), true
			}
			break
		}
		limit := min(free, BatchMax)
		if p.ClaimMax > 0 {
			limit = min(limit, p.ClaimMax)
		}
		n, due, err := p.Dispatcher.Dispatch(ctx, limit)
		if err != nil {
			p.logError(ctx, "dispatch: claim", err)
			break
		}
		if !armed {
			wait, armed = p.setTimer(timer, due), true
		}
		if n < limit {
			break
		}
	}
	if !armed {
		wait = p.armTimer(ctx, timer)
	}
	return wait
}

// armTimer sets the timer to the earliest future next_attempt_at, measured on the database's clock, capped by
// the poll interval.
func (p *Poller) armTimer(ctx context.Context, t *time.Timer) time.Duration {
	var due store.NextDue
	var err error
	due.At, due.DBNow, err = store.NextClaimAt(ctx, p.DB)
	if err != nil {
		p.logError(ctx, "dispatch: next claim time", err)
	}
	return p.setTimer(t, due)
}

// setTimer sets the timer to due (the poll interval when nothing is due), capped by the poll interval.
func (p *Poller) setTimer(t *time.Timer, due store.NextDue) time.Duration {
	wait := p.PollInterval
	if due.At != nil {
		wait = min(max(due.At.Sub(due.DBNow), 0), p.PollInterval)
	}
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(wait)
	return wait
}

func (p *Poller) logError(ctx context.Context, msg string, err error) {
	if ctx.Err() != nil {
		return // shutting down: not an error
	}
	p.Logger.Error(msg, slog.Any("error", err))
}
