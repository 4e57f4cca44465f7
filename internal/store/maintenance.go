package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TryAdvisoryXactLock takes the transaction-scoped advisory lock key if no other session holds it, and reports
// whether it did. The lock is released when tx ends, so it never outlives the round that took it (and works
// through a transaction pooler).
func TryAdvisoryXactLock(ctx context.Context, tx pgx.Tx, key int64) (bool, error) {
	var won bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, key).Scan(&won); err != nil {
		return false, fmt.Errorf("store: advisory lock %#x: %w", key, err)
	}
	return won, nil
}

// DBNow returns the database's clock (now(): the start of the current transaction, or of this statement outside
// one).
func DBNow(ctx context.Context, db DBTX) (time.Time, error) {
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("store: read the database's time: %w", err)
	}
	return now, nil
}

// FinishedBefore returns the retention cut-off for keep: the database's now minus keep.
func FinishedBefore(ctx context.Context, db DBTX, keep time.Duration) (time.Time, error) {
	var cutoff time.Time
	if err := db.QueryRow(ctx, `SELECT now() - make_interval(secs => $1)`, keep.Seconds()).Scan(&cutoff); err != nil {
		return time.Time{}, fmt.Errorf("store: retention cut-off: %w", err)
	}
	return cutoff, nil
}

// DueSchedule is one row of due_schedules: a schedule whose next fire time has come (or that has none yet).
type DueSchedule struct {
	Name     string
	Cron     string
	Timezone string
	// NextFireAt is the fire time due now; nil for a schedule inserted by plain SQL that has none yet.
	NextFireAt *time.Time
}

// DueSchedules calls due_schedules: at most limit unpaused schedules due at asOf, a schedule whose last fire
// failed only once errorRetry has passed.
func DueSchedules(ctx context.Context, db DBTX, asOf time.Time, errorRetry time.Duration, limit int) ([]DueSchedule, error) {
	rows, err := db.Query(ctx, `SELECT name, cron, timezone, next_fire_at FROM stepready.due_schedules($1, $2, $3)`,
		asOf, ms(errorRetry), limit)
	if err != nil {
		return nil, fmt.Errorf("store: due schedules: %w", err)
	}
	due, err := pgx.CollectRows(rows, pgx.RowToStructByPos[DueSchedule])
	if err != nil {
		return nil, fmt.Errorf("store: due schedules: %w", err)
	}
	return due, nil
}

// ScheduleFailed records on schedule name that it cannot fire (message in last_error), so it is retried after
// the error retry of due_schedules.
func ScheduleFailed(ctx context.Context, db DBTX, name, message string, asOf time.Time) error {
	if _, err := db.Exec(ctx, `SELECT stepready.schedule_failed($1, $2, $3)`, name, message, asOf); err != nil {
		return fmt.Errorf("store: record the failure of schedule %q: %w", name, err)
	}
	return nil
}

// SetScheduleNextFire sets the first fire time of a schedule that has none.
func SetScheduleNextFire(ctx context.Context, db DBTX, name string, next time.Time) error {
	if _, err := db.Exec(ctx, `SELECT stepready.set_schedule_next_fire($1, $2)`, name, next); err != nil {
		return fmt.Errorf("store: set the next fire time of schedule %q: %w", name, err)
	}
	return nil
}

// Fire is what fire_schedule did with one fire time.
type Fire struct {
	// Outcome is fired, skipped (overlap: skip and the previous task still runs), failed or stale (another
	// instance moved the schedule on first).
	Outcome string
	// TaskID is the task created (fired) or the previous task still running (skipped).
	TaskID *int64
	// Error is the reason of a failed fire.
	Error *string
}

// FireSchedule calls fire_schedule: if name's next fire time is still expected, it creates the task of fire
// time fireAt (idempotently, keyed schedule:NAME:FIRE_TIME) and moves next_fire_at to next.
func FireSchedule(ctx context.Context, db DBTX, name string, expected, fireAt, next, asOf time.Time) (Fire, error) {
	var f Fire
	if err := db.QueryRow(ctx, `SELECT outcome, task_id, error FROM stepready.fire_schedule($1, $2, $3, $4, $5)`,
		name, expected, fireAt, next, asOf).Scan(&f.Outcome, &f.TaskID, &f.Error); err != nil {
		return Fire{}, fmt.Errorf("store: fire schedule %q: %w", name, err)
	}
	return f, nil
}

// NextScheduleWake returns when the next schedule becomes due (nil: none), with the database's now.
func NextScheduleWake(ctx context.Context, db DBTX, errorRetry time.Duration) (next *time.Time, dbNow time.Time, err error) {
	if err := db.QueryRow(ctx, `SELECT stepready.next_schedule_wake(now(), $1), now()`, ms(errorRetry)).
		Scan(&next, &dbNow); err != nil {
		return nil, time.Time{}, fmt.Errorf("store: next schedule fire time: %w", err)
	}
	return next, dbNow, nil
}
