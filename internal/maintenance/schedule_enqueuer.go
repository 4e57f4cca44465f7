package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/schedules"
)

// Schedule enqueuer defaults (SPEC §15).
const (
	// ScheduleEnqueuerIntervalDefault bounds the sleep between rounds: how soon a new or changed schedule, or the
	// death of the instance that led the last round, is noticed. Between rounds the enqueuer sleeps until the
	// next fire time, at most this long.
	ScheduleEnqueuerIntervalDefault = time.Second
	// ScheduleErrorRetryDefault is how long a schedule whose fire failed (missing template, bad cron) waits
	// before the next try.
	ScheduleErrorRetryDefault = 5 * time.Second
	// ScheduleBatchDefault is how many due schedules one round fires at most; a longer backlog takes more rounds
	// (each one right after the last).
	ScheduleBatchDefault = 100
	// notLeaderWait is the shortest sleep of an instance that lost the election while schedules are due: the
	// elected one is firing them.
	notLeaderWait = 200 * time.Millisecond
)

// ScheduleEnqueuerConfig configures a ScheduleEnqueuer. Zero values take the defaults.
type ScheduleEnqueuerConfig struct {
	// Interval is the longest sleep between rounds (default ScheduleEnqueuerIntervalDefault; Off turns schedules
	// off on this instance).
	Interval time.Duration
	// ErrorRetry is the wait after a failed fire (default ScheduleErrorRetryDefault).
	ErrorRetry time.Duration
	// Batch is the most due schedules one round fires (default ScheduleBatchDefault).
	Batch int
	// Timeout bounds one round (default TimeoutDefault).
	Timeout time.Duration
}

// ScheduleEnqueuer fires due schedules: on the elected instance of each round, each due fire time is a
// compare-and-swap on the schedule's next_fire_at plus an idempotent task creation (key
// schedule:NAME:FIRE_TIME), so any number of instances create exactly one task per fire time. Between rounds it
// sleeps until the next fire time by the database's clock, at most Interval.
type ScheduleEnqueuer struct {
	env Env
	cfg ScheduleEnqueuerConfig
}

// ScheduleRound says what one ScheduleEnqueuer round did.
type ScheduleRound struct {
	// Leader is true when this instance won the round's election.
	Leader bool
	// Fired, Skipped and Failed count the schedules' outcomes in this round.
	Fired, Skipped, Failed int
	// Wait is how long to sleep before the next round.
	Wait time.Duration
}

// NewScheduleEnqueuer checks cfg and builds the service.
func NewScheduleEnqueuer(env Env, cfg ScheduleEnqueuerConfig) (*ScheduleEnqueuer, error) {
	cfg.Interval = cmp.Or(cfg.Interval, ScheduleEnqueuerIntervalDefault)
	cfg.ErrorRetry = cmp.Or(cfg.ErrorRetry, ScheduleErrorRetryDefault)
	cfg.Batch = cmp.Or(cfg.Batch, ScheduleBatchDefault)
	cfg.Timeout = cmp.Or(cfg.Timeout, TimeoutDefault)
	errs := []error{env.validate(), checkInterval("ScheduleEnqueuerConfig.Interval", cfg.Interval),
		checkBatch("ScheduleEnqueuerConfig", cfg.Batch, cfg.Timeout)}
	if cfg.ErrorRetry < 0 {
		errs = append(errs, fmt.Errorf("ScheduleEnqueuerConfig.ErrorRetry must be > 0, got %s", cfg.ErrorRetry))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("maintenance: schedule enqueuer: %w", err)
	}
	return &ScheduleEnqueuer{env: env.withDefaults(), cfg: cfg}, nil
}

func (e *ScheduleEnqueuer) name() string         { return "schedule enqueuer" }
func (e *ScheduleEnqueuer) every() time.Duration { return e.cfg.Interval }

func (e *ScheduleEnqueuer) round(ctx context.Context) (time.Duration, error) {
	r, err := e.RunOnce(ctx)
	return r.Wait, err
}

// RunOnce runs one round: if this instance wins the election it fires every due schedule (up to Batch), then
// it computes the wait until the next fire time.
func (e *ScheduleEnqueuer) RunOnce(ctx context.Context) (ScheduleRound, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	var r ScheduleRound
	var err error
	r.Leader, err = elect(ctx, e.env.Pool, lockScheduleEnqueuer, func(ctx context.Context, tx pgx.Tx) error {
		now, err := store.DBNow(ctx, tx)
		if err != nil {
			return err
		}
		dues, err := store.DueSchedules(ctx, tx, now, e.cfg.ErrorRetry, e.cfg.Batch)
		if err != nil {
			return err
		}
		for _, d := range dues {
			// One savepoint per schedule: an unexpected error in one never undoes the others' fires.
			err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return e.fire(ctx, sp, &r, now, d) })
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				r.Failed++
				e.env.Metrics.ScheduleErrored(d.Name)
				e.env.Logger.Error("maintenance: schedule enqueuer: fire failed", slog.String("schedule", d.Name),
					slog.Any("error", err))
			}
		}
		return nil
	})
	if err != nil {
		r.Wait = e.cfg.Interval
		return r, fmt.Errorf("maintenance: schedule enqueuer: %w", err)
	}
	if r.Wait, err = e.wait(ctx, r.Leader); err != nil {
		return r, fmt.Errorf("maintenance: schedule enqueuer: %w", err)
	}
	return r, nil
}

// fire handles one due schedule.
func (e *ScheduleEnqueuer) fire(ctx context.Context, tx pgx.Tx, r *ScheduleRound, now time.Time, d store.DueSchedule) error {
	spec, err := schedules.Parse(d.Cron, d.Timezone)
	if err != nil {
		r.Failed++
		e.env.Metrics.ScheduleErrored(d.Name)
		e.env.Logger.Error("maintenance: schedule enqueuer: invalid schedule", slog.String("schedule", d.Name),
			slog.Any("error", err))
		return store.ScheduleFailed(ctx, tx, d.Name, err.Error(), now)
	}
	if d.NextFireAt == nil {
		// Inserted by plain SQL (or its cron was fixed): its first fire time is the next one after now.
		return store.SetScheduleNextFire(ctx, tx, d.Name, spec.Next(now))
	}
	fireAt := spec.Latest(*d.NextFireAt, now)
	f, err := store.FireSchedule(ctx, tx, d.Name, *d.NextFireAt, fireAt, spec.Next(fireAt), now)
	if err != nil {
		return err
	}
	e.env.Metrics.ScheduleFired(f.Outcome)
	attrs := []any{slog.String("schedule", d.Name), slog.Time("fire_at", fireAt)}
	if fireAt.After(*d.NextFireAt) {
		attrs = append(attrs, slog.Time("missed_from", *d.NextFireAt))
	}
	switch f.Outcome {
	case "fired":
		r.Fired++
		e.env.Logger.Info("maintenance: schedule enqueuer: fired", append(attrs, slog.Int64("task_id", deref(f.TaskID)))...)
	case "skipped":
		r.Skipped++
		e.env.Logger.Info("maintenance: schedule enqueuer: skipped: previous task still running",
			append(attrs, slog.Int64("previous_task_id", deref(f.TaskID)))...)
	case "failed":
		r.Failed++
		e.env.Metrics.ScheduleErrored(d.Name)
		e.env.Logger.Error("maintenance: schedule enqueuer: fire failed", append(attrs, slog.String("error", deref(f.Error)))...)
	}
	return nil
}

// wait computes the sleep until the next round from the database's clock: until the next fire time, at most
// Interval; a loser of the election sleeps at least notLeaderWait (the leader is firing what is due).
func (e *ScheduleEnqueuer) wait(ctx context.Context, leader bool) (time.Duration, error) {
	next, now, err := store.NextScheduleWake(ctx, e.env.Pool, e.cfg.ErrorRetry)
	if err != nil {
		return e.cfg.Interval, err
	}
	if next == nil {
		return e.cfg.Interval, nil
	}
	// now() is the start of this statement's transaction; a millisecond more so the round sees the fire as due.
	w := next.Sub(now) + time.Millisecond
	if !leader {
		w = max(w, notLeaderWait)
	}
	return min(max(w, time.Millisecond), e.cfg.Interval), nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
