package dispatch

import (
	"context"
	"log/slog"
	"strings"
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
	// ProbeInterval is how often the poller reads the wake-up counter (store.WakeCount) while it waits; when the
	// counter moved since it last read it, the poller claims. It is how work made ready by a transaction that sent
	// no NOTIFY (every writing transaction since schema version 21: plain SQL, a worker in another language,
	// another daemon's completions) starts promptly. 0 or less: no probing (notifications and the poll interval
	// only).
	ProbeInterval time.Duration

	// The wake-up counter as last read (by a probe or with a claim), and the re-claims that follow a move.
	probe probeState
	// dueAt is when the due timer is set to fire; zero once its firing was taken (Run goroutine only).
	dueAt time.Time
}

// settleMax bounds the wait between the re-claims that follow a move of the wake-up counter. A transaction
// advances the counter in the statement that readies a step, before it commits, so a claim made at once may not
// see its rows yet: the poller claims again ProbeInterval later, then after twice that wait, and so on up to
// settleMax (with 25 ms: 25, 75, 175, 375, 775, 1,575 ms after the move). Then it claims once more when every
// transaction that was running at the move has ended (the snapshot's xmin has passed the xmax read with the
// move), checking every settleMax; so work is found whatever the time its transaction takes to commit. A
// transaction running longer than the poll interval is left to the poll.
const settleMax = time.Second

// probeState is the Poller's view of the wake-up counter. Only the Run goroutine uses it.
type probeState struct {
	known     bool
	count     int64
	recheckAt time.Time     // zero: no re-claim due
	step      time.Duration // the wait before recheckAt
	horizon   int64         // the snapshot's xmax at the last move: transactions below it may have moved it
	movedAt   time.Time
}

// observe records a reading of the counter (with the snapshot's xmax read with it) and says whether it moved
// since the last one. A move (re)starts the re-claims.
func (s *probeState) observe(count, xmax int64, now time.Time, interval time.Duration) bool {
	if !s.known {
		s.known, s.count = true, count
		return false
	}
	if count == s.count {
		return false
	}
	s.count = count
	s.step = interval
	s.recheckAt = now.Add(interval)
	s.horizon = max(s.horizon, xmax)
	s.movedAt = now
	return true
}

// recheckDue says whether a re-claim is due at now, given the oldest running transaction (xmin), and schedules
// the next one.
func (s *probeState) recheckDue(now time.Time, xmin int64, giveUp time.Duration) bool {
	if s.recheckAt.IsZero() || now.Before(s.recheckAt) {
		return false
	}
	if s.step >= settleMax && (xmin >= s.horizon || now.Sub(s.movedAt) > giveUp) {
		// Every transaction that could have moved the counter has ended: this claim sees all their rows.
		s.recheckAt, s.horizon = time.Time{}, 0
		return true
	}
	s.step = min(s.step*2, settleMax)
	s.recheckAt = now.Add(s.step)
	return true
}

// Run claims until ctx is done. Errors are logged and retried at the next wake-up; a cancelled ctx returns nil.
func (p *Poller) Run(ctx context.Context) error {
	due := time.NewTimer(p.PollInterval)
	defer due.Stop()
	tick := time.NewTicker(p.PollInterval)
	defer tick.Stop()
	var probe <-chan time.Time
	if p.ProbeInterval > 0 {
		t := time.NewTicker(p.ProbeInterval)
		defer t.Stop()
		probe = t.C
	}
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
		wait := p.claimAll(ctx, due, why == "due timer", strings.HasPrefix(why, "wake-up counter"))
		p.Logger.Debug("dispatch: waiting", slog.Duration("next_due_in", wait))
		why = p.wait(ctx, due, tick, probe)
		if why == "" {
			return nil
		}
		p.Logger.Debug("dispatch: woken", slog.String("by", why))
	}
}

// wait blocks until something calls for a claim and says what ("" when ctx is done). A probe that finds the
// wake-up counter where it was, with no re-claim due, keeps waiting.
func (p *Poller) wait(ctx context.Context, due *time.Timer, tick *time.Ticker, probe <-chan time.Time) string {
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-p.Wake:
			return "notification"
		case <-due.C:
			p.dueAt = time.Time{}
			return "due timer"
		case <-tick.C:
			return "poll interval"
		case <-p.Dispatcher.Freed():
			return "capacity freed"
		case now := <-probe:
			r, err := store.ReadWakeProbe(ctx, p.DB)
			if err != nil {
				p.logError(ctx, "dispatch: probe the wake-up counter", err)
				continue
			}
			if p.probe.observe(r.Count, r.XMax, now, p.ProbeInterval) {
				return "wake-up counter"
			}
			if p.probe.recheckDue(now, r.XMin, p.PollInterval) {
				return "wake-up counter, again"
			}
		}
	}
}

// claimAll claims batches while there is capacity and the last batch came back full, and arms the timer: from
// the first claim (which reads next_claim_at before claiming), or on its own when nothing was claimed.
//
// dueTimer says the due timer woke the poller, wakeUp the wake-up counter. With no free capacity either one still
// runs a claim of zero steps:
// the claim's prologue ends the durable sleeps and signal timeouts that are due (sql/059_signals.sql), so a wait
// ends on time while every worker slot of this daemon is busy, and the dependents go to whichever daemon has room.
func (p *Poller) claimAll(ctx context.Context, timer *time.Timer, dueTimer, wakeUp bool) time.Duration {
	armed := false
	var wait time.Duration
	for ctx.Err() == nil {
		free, err := p.Dispatcher.Free(ctx)
		if err != nil {
			p.logError(ctx, "dispatch: free capacity", err)
			break
		}
		if free == 0 {
			// Woken by the due timer, or by the wake-up counter (which may announce a wait whose end is near or,
			// the creating transaction having committed late, already past: next_claim_at then no longer reports
			// it, so arming the timer alone would leave it to the poll interval).
			if (dueTimer || wakeUp) && !armed {
				_, due, err := p.Dispatcher.Dispatch(ctx, 0)
				if err != nil {
					p.logError(ctx, "dispatch: claim", err)
					break
				}
				wait, armed = p.setTimer(timer, due), true
				p.probe.observe(due.Wakeups, due.XMax, time.Now(), p.ProbeInterval)
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
			p.probe.observe(due.Wakeups, due.XMax, time.Now(), p.ProbeInterval)
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
	due, err := store.ReadNextDue(ctx, p.DB)
	if err != nil {
		p.logError(ctx, "dispatch: next claim time", err)
	} else {
		p.probe.observe(due.Wakeups, due.XMax, time.Now(), p.ProbeInterval)
	}
	return p.setTimer(t, due)
}

// setTimer sets the timer to due (the poll interval when nothing is due), capped by the poll interval, unless it
// is set to fire earlier: an earlier time is kept, even one that has passed without its firing being taken. A
// re-arm must not push a due time back: next_claim_at reports only what is due after now, so a sleep whose end
// passed (its wait still to be ended by a claim's prologue) is no longer in it, and a re-arm just after the end
// (a re-claim after a move of the wake-up counter, with no capacity to claim) lost the timer's firing for the
// poll interval (TestSleepEndsWhileEveryWorkerSlotIsBusy, about one run in three at load 20).
func (p *Poller) setTimer(t *time.Timer, due store.NextDue) time.Duration {
	wait := p.PollInterval
	if due.At != nil {
		wait = min(max(due.At.Sub(due.DBNow), 0), p.PollInterval)
	}
	now := time.Now()
	if !p.dueAt.IsZero() && p.dueAt.Before(now.Add(wait)) {
		wait = max(p.dueAt.Sub(now), 0)
	}
	p.dueAt = now.Add(wait)
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
