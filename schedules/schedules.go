package schedules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stepready/stepready/internal/store"
)

// DBTX is what the calls need to reach the database: *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy it, so a
// call runs on a pool, on a connection, or inside the caller's transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Overlap policies of a schedule.
const (
	// OverlapAllow fires at every fire time, whether the previous task has finished or not. The default.
	OverlapAllow = "allow"
	// OverlapSkip skips a fire time while the schedule's previous task is not terminal (recorded in
	// last_skipped_at and skipped_count; no task).
	OverlapSkip = "skip"
)

// ErrNotFound is returned for a schedule name that does not exist.
var ErrNotFound = errors.New("schedules: schedule does not exist")

// ErrExists is returned by Create for a name that is already taken.
var ErrExists = errors.New("schedules: schedule already exists")

// Definition is what a user writes: the fields of `scheduler schedule create` and of a template's
// `schedules:` list (YAML, read through its JSON form).
type Definition struct {
	// Name identifies the schedule; it is part of every task's idempotency key. Required.
	Name string `json:"name"`
	// Template is the task template each fire creates a task from (its newest version at the time). Required.
	Template string `json:"template"`
	// Cron is five fields, six with seconds first, @every DURATION, or a descriptor (@hourly, @daily, …).
	Cron string `json:"cron"`
	// Timezone is the IANA zone the cron fields are read in (default UTC).
	Timezone string `json:"timezone,omitempty"`
	// Context is merged over the template's context in every task (a JSON object; default {}).
	Context json.RawMessage `json:"context,omitempty"`
	// Overlap is OverlapAllow (default) or OverlapSkip.
	Overlap string `json:"overlap,omitempty"`
}

// Validate checks the definition and returns its parsed cron spec. Every error wraps ErrInvalid and names the
// field.
func (d *Definition) Validate() (*Spec, error) {
	if d.Name == "" {
		return nil, fmt.Errorf("%w: name: is required", ErrInvalid)
	}
	if d.Template == "" {
		return nil, fmt.Errorf("%w: schedule %q: template: is required", ErrInvalid, d.Name)
	}
	if d.Overlap == "" {
		d.Overlap = OverlapAllow
	}
	if d.Overlap != OverlapAllow && d.Overlap != OverlapSkip {
		return nil, fmt.Errorf("%w: schedule %q: overlap: must be allow or skip, got %q", ErrInvalid, d.Name, d.Overlap)
	}
	if d.Timezone == "" {
		d.Timezone = "UTC"
	}
	if len(d.Context) == 0 || string(d.Context) == "null" {
		d.Context = json.RawMessage(`{}`)
	}
	var obj map[string]any
	if err := json.Unmarshal(d.Context, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("%w: schedule %q: context: must be a JSON object", ErrInvalid, d.Name)
	}
	spec, err := Parse(d.Cron, d.Timezone)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", d.Name, err)
	}
	return spec, nil
}

// Put validates d and stores it: a new schedule, or with replace an update of an existing one (its fire history
// and pause are kept; its next fire time changes only when cron or timezone did). Without replace an existing
// name is ErrExists. It returns whether the schedule was created. db is a pool, a connection or a transaction.
func Put(ctx context.Context, db DBTX, d Definition, replace bool) (bool, error) {
	spec, err := d.Validate()
	if err != nil {
		return false, err
	}
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return false, fmt.Errorf("schedules: put %q: %w", d.Name, err)
	}
	var created bool
	err = db.QueryRow(ctx, `SELECT stepready.put_schedule($1, $2, $3, $4, $5, $6, $7, $8)`,
		d.Name, d.Template, d.Cron, d.Timezone, string(d.Context), d.Overlap, spec.Next(now), replace).Scan(&created)
	if err != nil {
		if store.SQLState(err) == "23505" {
			return false, fmt.Errorf("%w: %q (delete it first, or apply it from a template to replace it)", ErrExists, d.Name)
		}
		return false, fmt.Errorf("schedules: put %q: %w", d.Name, err)
	}
	return created, nil
}

// Schedule is one row of stepready.schedules (docs/tables.md).
type Schedule struct {
	Name           string          `json:"name"`
	Template       string          `json:"template"`
	Cron           string          `json:"cron"`
	Timezone       string          `json:"timezone"`
	Context        json.RawMessage `json:"context"`
	Overlap        string          `json:"overlap"`
	Paused         bool            `json:"paused"`
	NextFireAt     *time.Time      `json:"next_fire_at"`
	LastFiredAt    *time.Time      `json:"last_fired_at"`
	LastTaskID     *int64          `json:"last_task_id"`
	LastSkippedAt  *time.Time      `json:"last_skipped_at"`
	SkippedCount   int64           `json:"skipped_count"`
	LastError      *string         `json:"last_error"`
	LastErrorAt    *time.Time      `json:"last_error_at"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	LastTaskStatus *string         `json:"last_task_status"`
}

const listSQL = `SELECT s.name, s.template, s.cron, s.timezone, s.context, s.overlap, s.paused, s.next_fire_at,
       s.last_fired_at, s.last_task_id, s.last_skipped_at, s.skipped_count, s.last_error, s.last_error_at,
       s.created_at, s.updated_at, t.status
  FROM stepready.schedules s LEFT JOIN stepready.tasks t ON t.id = s.last_task_id`

func scan(row pgx.CollectableRow) (Schedule, error) {
	var s Schedule
	err := row.Scan(&s.Name, &s.Template, &s.Cron, &s.Timezone, (*[]byte)(&s.Context), &s.Overlap, &s.Paused,
		&s.NextFireAt, &s.LastFiredAt, &s.LastTaskID, &s.LastSkippedAt, &s.SkippedCount, &s.LastError,
		&s.LastErrorAt, &s.CreatedAt, &s.UpdatedAt, &s.LastTaskStatus)
	return s, err
}

// List returns every schedule, by name.
func List(ctx context.Context, db DBTX) ([]Schedule, error) {
	rows, err := db.Query(ctx, listSQL+` ORDER BY s.name`)
	if err != nil {
		return nil, fmt.Errorf("schedules: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("schedules: list: %w", err)
	}
	return out, nil
}

// Get returns schedule name, or ErrNotFound.
func Get(ctx context.Context, db DBTX, name string) (Schedule, error) {
	rows, err := db.Query(ctx, listSQL+` WHERE s.name = $1`, name)
	if err != nil {
		return Schedule{}, fmt.Errorf("schedules: get %q: %w", name, err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return Schedule{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return Schedule{}, fmt.Errorf("schedules: get %q: %w", name, err)
	}
	return s, nil
}

// Preview returns the next n fire times of schedule name: from its stored next fire time when it has one and
// is not paused, else from the database's now.
func Preview(ctx context.Context, db DBTX, name string, n int) ([]time.Time, error) {
	s, err := Get(ctx, db, name)
	if err != nil {
		return nil, err
	}
	spec, err := Parse(s.Cron, s.Timezone)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", name, err)
	}
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, fmt.Errorf("schedules: preview %q: %w", name, err)
	}
	var first time.Time
	if s.NextFireAt != nil && !s.Paused {
		first = *s.NextFireAt
	}
	return spec.Preview(first, now, n), nil
}

// Pause stops schedule name from firing until Resume.
func Pause(ctx context.Context, db DBTX, name string) error {
	return exec(ctx, db, "pause", `SELECT stepready.pause_schedule($1)`, name)
}

// Resume lets a paused schedule fire again, from its first fire time after now (fire times that passed while
// it was paused do not fire). Resuming a running schedule changes nothing.
func Resume(ctx context.Context, db DBTX, name string) error {
	s, err := Get(ctx, db, name)
	if err != nil {
		return err
	}
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return fmt.Errorf("schedules: resume %q: %w", name, err)
	}
	var next *time.Time
	if spec, err := Parse(s.Cron, s.Timezone); err == nil {
		n := spec.Next(now)
		next = &n
	} // else: NULL, the schedule enqueuer reports the error
	_, err = db.Exec(ctx, `SELECT stepready.resume_schedule($1, $2)`, name, next)
	if err != nil {
		return fmt.Errorf("schedules: resume %q: %w", name, wrapNotFound(err, name))
	}
	return nil
}

// Delete removes schedule name; the tasks it created stay.
func Delete(ctx context.Context, db DBTX, name string) error {
	return exec(ctx, db, "delete", `SELECT stepready.delete_schedule($1)`, name)
}

func exec(ctx context.Context, db DBTX, what, sql, name string) error {
	if _, err := db.Exec(ctx, sql, name); err != nil {
		return fmt.Errorf("schedules: %s %q: %w", what, name, wrapNotFound(err, name))
	}
	return nil
}

func wrapNotFound(err error, name string) error {
	if store.SQLState(err) == "P0002" {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return err
}
