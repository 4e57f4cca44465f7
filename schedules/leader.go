package schedules

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// LeaderLockKey is the transaction advisory lock that elects the one instance firing schedules in a round
// ("StepSch\x01").
const LeaderLockKey int64 = 0x5374_6570_5363_6801

// Leader defaults.
const (
	// MaxWaitDefault bounds the leader's sleep between rounds: how soon a new or changed schedule, or the death
	// of the instance that led the last round, is noticed.
	MaxWaitDefault = time.Second
	// ErrorRetryDefault is how long a schedule whose fire failed (missing template, bad cron) waits before the
	// next try.
	ErrorRetryDefault = 5 * time.Second
	// BatchDefault is how many due schedules one round handles at most; a longer backlog takes more rounds.
	BatchDefault = 100
	// notLeaderWait is the shortest sleep of an instance that lost the election while schedules are due: the
	// leader is firing them.
	notLeaderWait = 200 * time.Millisecond
	// queryTimeout bounds one round.
	queryTimeout = 30 * time.Second
)

// Leader fires due schedules. Every daemon runs one; in each round only the instance that takes LeaderLockKey
// (pg_try_advisory_xact_lock) works, and each fire is a compare-and-swap on the schedule's next_fire_at plus an
// idempotent task creation, so any number of instances create exactly one task per fire time. Between rounds it
// sleeps until the next fire time (from the database's clock), at most MaxWait.
type Leader struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Logger receives the leader's logs (nil: discarded).
	Logger *slog.Logger
	// Metrics counts fires and errors (nil: none).
	Metrics *Metrics
	// MaxWait bounds the sleep between rounds (default MaxWaitDefault).
	MaxWait time.Duration
	// ErrorRetry is the wait after a failed fire (default ErrorRetryDefault).
	ErrorRetry time.Duration
	// Batch is the number of due schedules per round (default BatchDefault).
	Batch int
	// Now is the clock used only to measure sleeps (default time.Now); fire times come from the database.
	Now func() time.Time
}

// Round says what one RunOnce did.
type Round struct {
	// Leader is true when this instance won the round's election.
	Leader bool
	// Fired, Skipped and Failed count the schedules' outcomes in this round.
	Fired, Skipped, Failed int
	// Wait is how long to sleep before the next round.
	Wait time.Duration
}

func (l *Leader) defaults() {
	l.MaxWait = cmp.Or(l.MaxWait, MaxWaitDefault)
	l.ErrorRetry = cmp.Or(l.ErrorRetry, ErrorRetryDefault)
	l.Batch = cmp.Or(l.Batch, BatchDefault)
	if l.Logger == nil {
		l.Logger = slog.New(slog.DiscardHandler)
	}
}

// Run fires schedules until ctx is done. Errors are logged and retried; they never stop it.
func (l *Leader) Run(ctx context.Context) error {
	l.defaults()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		r, err := l.RunOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			l.Logger.Error("schedules: leader round failed", slog.Any("error", err))
			r.Wait = l.MaxWait
		}
		timer.Reset(r.Wait)
	}
}

// RunOnce runs one round: if this instance wins the election it fires every due schedule (up to Batch), then
// it computes the wait until the next fire time.
func (l *Leader) RunOnce(ctx context.Context) (Round, error) {
	l.defaults()
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var r Round
	errMS := l.ErrorRetry.Milliseconds()
	err := pgx.BeginFunc(ctx, l.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, LeaderLockKey).Scan(&r.Leader); err != nil {
			return fmt.Errorf("schedules: leader election: %w", err)
		}
		if !r.Leader {
			return nil
		}
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return fmt.Errorf("schedules: read time: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT name, cron, timezone, next_fire_at
			FROM stepready.due_schedules($1, $2, $3)`, now, errMS, l.Batch)
		if err != nil {
			return fmt.Errorf("schedules: due schedules: %w", err)
		}
		type due struct {
			name, cron, tz string
			next           *time.Time
		}
		dues, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (due, error) {
			var d due
			return d, row.Scan(&d.name, &d.cron, &d.tz, &d.next)
		})
		if err != nil {
			return fmt.Errorf("schedules: due schedules: %w", err)
		}
		for _, d := range dues {
			// One savepoint per schedule: an unexpected error in one never undoes the others' fires.
			err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return l.fire(ctx, sp, &r, now, d.name, d.cron, d.tz, d.next) })
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				r.Failed++
				l.Metrics.errored(d.name)
				l.Logger.Error("schedules: fire failed", slog.String("schedule", d.name), slog.Any("error", err))
			}
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	r.Wait, err = l.wait(ctx, r.Leader)
	return r, err
}

// fire handles one due schedule.
func (l *Leader) fire(ctx context.Context, tx pgx.Tx, r *Round, now time.Time, name, cron, tz string,
	next *time.Time,
) error {
	spec, err := Parse(cron, tz)
	if err != nil {
		r.Failed++
		l.Metrics.errored(name)
		l.Logger.Error("schedules: invalid schedule", slog.String("schedule", name), slog.Any("error", err))
		_, err := tx.Exec(ctx, `SELECT stepready.schedule_failed($1, $2, $3)`, name, err.Error(), now)
		return err
	}
	if next == nil {
		// Inserted by plain SQL (or its cron was fixed): its first fire time is the next one after now.
		_, err := tx.Exec(ctx, `SELECT stepready.set_schedule_next_fire($1, $2)`, name, spec.Next(now))
		return err
	}
	fireAt := spec.Latest(*next, now)
	var (
		outcome string
		taskID  *int64
		fireErr *string
	)
	if err := tx.QueryRow(ctx, `SELECT outcome, task_id, error FROM stepready.fire_schedule($1, $2, $3, $4, $5)`,
		name, *next, fireAt, spec.Next(fireAt), now).Scan(&outcome, &taskID, &fireErr); err != nil {
		return err
	}
	l.Metrics.fired(outcome)
	attrs := []any{slog.String("schedule", name), slog.Time("fire_at", fireAt)}
	if fireAt.After(*next) {
		attrs = append(attrs, slog.Time("missed_from", *next))
	}
	switch outcome {
	case "fired":
		r.Fired++
		l.Logger.Info("schedules: fired", append(attrs, slog.Int64("task_id", deref(taskID)))...)
	case "skipped":
		r.Skipped++
		l.Logger.Info("schedules: skipped: previous task still running",
			append(attrs, slog.Int64("previous_task_id", deref(taskID)))...)
	case "failed":
		r.Failed++
		l.Metrics.errored(name)
		l.Logger.Error("schedules: fire failed", append(attrs, slog.String("error", deref(fireErr)))...)
	}
	return nil
}

// wait computes the sleep until the next round from the database's clock: until the next fire time, at most
// MaxWait; a loser of the election sleeps at least notLeaderWait (the leader is firing what is due).
func (l *Leader) wait(ctx context.Context, leader bool) (time.Duration, error) {
	var (
		next *time.Time
		now  time.Time
	)
	if err := l.Pool.QueryRow(ctx, `SELECT stepready.next_schedule_wake(now(), $1), now()`,
		l.ErrorRetry.Milliseconds()).Scan(&next, &now); err != nil {
		return l.MaxWait, fmt.Errorf("schedules: next fire time: %w", err)
	}
	if next == nil {
		return l.MaxWait, nil
	}
	// now() is the start of this statement's transaction; a millisecond more so the round sees the fire as due.
	w := next.Sub(now) + time.Millisecond
	if !leader {
		w = max(w, notLeaderWait)
	}
	return min(max(w, time.Millisecond), l.MaxWait), nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Metrics are the leader's Prometheus collectors. Methods are safe on a nil *Metrics.
type Metrics struct {
	fires  *prometheus.CounterVec
	errors *prometheus.CounterVec
}

// NewMetrics creates the collectors stepready_schedule_fires_total{outcome} (fired, skipped, failed, stale) and
// stepready_schedule_errors_total{schedule}, registered with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		fires: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stepready_schedule_fires_total",
			Help: "Schedule fire times handled by this instance as leader, by outcome."}, []string{"outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stepready_schedule_errors_total",
			Help: "Schedule fires that failed (missing or invalid template, invalid cron or time zone)."},
			[]string{"schedule"}),
	}
	if reg != nil {
		m.fires = register(reg, m.fires)
		m.errors = register(reg, m.errors)
	}
	return m
}

func (m *Metrics) fired(outcome string) {
	if m != nil {
		m.fires.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) errored(schedule string) {
	if m != nil {
		m.errors.WithLabelValues(schedule).Inc()
	}
}

// register registers c with reg; when an identical collector is already registered (a second client on the same
// registry), that one is used, so both clients count into the same series.
func register(reg prometheus.Registerer, c *prometheus.CounterVec) *prometheus.CounterVec {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
		panic(fmt.Sprintf("schedules: register metrics: %v", err))
	}
	return c
}
