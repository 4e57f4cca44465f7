// Package schedules runs stepready's cron schedules (docs/schedules.md): parsing cron expressions and time zones,
// computing fire times and storing schedules in stepready.schedules. The daemon's schedule enqueuer (a
// maintenance service of every client) fires them.
//
// Fire times are computed here, in Go, with github.com/robfig/cron/v3 (the cron library of the Go ecosystem);
// the bookkeeping that makes a fire happen exactly once is SQL (sql/130_schedules.sql): one elected instance per
// round, a compare-and-swap on next_fire_at, and the task's idempotency key schedule:NAME:FIRE_TIME.
//
// A schedule's life:
//
//	put_schedule ──► next_fire_at = first fire after now
//	   │
//	   ▼   enqueuer round (elected instance), next_fire_at <= now
//	fire_schedule ──► fired   (task created, next_fire_at = following fire time)
//	              ──► skipped (overlap: skip, previous task still running; next_fire_at advances)
//	              ──► failed  (template missing/invalid: last_error set, retried after the enqueuer's ErrorRetry)
//	pause_schedule / resume_schedule (next fire after the resume) / delete_schedule
package schedules

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // time zones work on hosts without a zoneinfo database

	"github.com/robfig/cron/v3"
)

// parser accepts five fields (minute hour day-of-month month day-of-week), six with seconds first, and the
// descriptors @yearly @annually @monthly @weekly @daily @midnight @hourly and @every DURATION.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow |
	cron.Descriptor)

// ErrInvalid wraps every validation failure of a schedule; the message names the field (cron, timezone, …).
var ErrInvalid = errors.New("schedules: invalid schedule")

// Spec is a parsed cron expression in its time zone.
type Spec struct {
	sched cron.Schedule
	loc   *time.Location
	every time.Duration // > 0 for @every
}

// Parse parses expr (the cron field) and tz (an IANA time zone name such as Europe/Berlin; "" is UTC). The
// error wraps ErrInvalid and names the field. The time zone is a field of its own: a CRON_TZ= or TZ= prefix in
// expr is refused.
func Parse(expr, tz string) (*Spec, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" {
		return nil, fmt.Errorf("%w: cron: is required", ErrInvalid)
	}
	if strings.HasPrefix(expr, "CRON_TZ=") || strings.HasPrefix(expr, "TZ=") {
		return nil, fmt.Errorf("%w: cron %q: give the time zone in the timezone field, not in the expression",
			ErrInvalid, expr)
	}
	if tz == "" {
		tz = "UTC"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil || tz == "Local" {
		return nil, fmt.Errorf("%w: timezone %q: not an IANA time zone name (for example UTC, Europe/Berlin)",
			ErrInvalid, tz)
	}
	// The cron library fires @every at whole seconds: it would silently make @every 500ms fire every second and
	// @every 2500ms every 2 s. Refuse what it cannot keep.
	if rest, ok := strings.CutPrefix(expr, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err == nil && (d < time.Second || d%time.Second != 0) {
			return nil, fmt.Errorf("%w: cron %q: @every takes whole seconds, at least 1s (fires are whole seconds)",
				ErrInvalid, expr)
		}
	}
	sched, err := parser.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("%w: cron %q: %w", ErrInvalid, expr, err)
	}
	s := &Spec{sched: sched, loc: loc}
	if c, ok := sched.(cron.ConstantDelaySchedule); ok {
		s.every = c.Delay
	}
	// A valid expression that can never fire (30 February) would leave the schedule without a next fire time.
	if s.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("%w: cron %q: never fires", ErrInvalid, expr)
	}
	return s, nil
}

// Location is the spec's time zone.
func (s *Spec) Location() *time.Location { return s.loc }

// Next returns the first fire time strictly after t, in UTC; the zero time if there is none within five years
// (the cron library's search limit). Fire times are whole seconds. For @every DURATION it is t + DURATION
// (truncated to the second); the schedule's phase is kept by always computing from the previous fire time.
func (s *Spec) Next(t time.Time) time.Time {
	n := s.sched.Next(t.In(s.loc))
	if n.IsZero() {
		return n
	}
	return n.UTC()
}

// lookback windows tried by Latest, smallest first, so that the fire times walked stay few.
var lookback = []time.Duration{time.Minute, time.Hour, 24 * time.Hour, 32 * 24 * time.Hour, 367 * 24 * time.Hour,
	5 * 367 * 24 * time.Hour}

// Latest returns the latest fire time in [due, now] of a schedule whose next fire time is due (due <= now): the
// one fire time that fires after a period without a daemon (docs/schedules.md: only the latest missed fire time fires).
// It returns due itself when no later fire time has passed. @every schedules keep their phase: due + k × every.
func (s *Spec) Latest(due, now time.Time) time.Time {
	if !due.Before(now) {
		return due
	}
	if s.every > 0 {
		return due.Add(now.Sub(due) / s.every * s.every).UTC()
	}
	if n := s.Next(due); n.IsZero() || n.After(now) {
		return due.UTC()
	}
	// Walk from the shortest window before now that holds a fire time (never before due): a per-second schedule
	// missed for a year walks at most a minute of fire times.
	for _, w := range lookback {
		start := now.Add(-w)
		if start.Before(due) {
			start = due
		}
		t := s.Next(start)
		if t.IsZero() || t.After(now) {
			continue
		}
		for {
			n := s.Next(t)
			if n.IsZero() || n.After(now) {
				return t
			}
			t = n
		}
	}
	return due.UTC()
}

// Preview returns the next n fire times after from (or from first, when first is not zero: the stored next fire
// time, which keeps the phase of @every).
func (s *Spec) Preview(first, from time.Time, n int) []time.Time {
	out := make([]time.Time, 0, n)
	t := first
	if t.IsZero() {
		t = s.Next(from)
	}
	for len(out) < n && !t.IsZero() {
		out = append(out, t.UTC())
		t = s.Next(t)
	}
	return out
}
