package schedules

import (
	"testing"
	"time"
)

// FuzzParse: any expression and zone either fails with ErrInvalid or yields a spec whose fire times move
// forward and whose Latest stays within [due, now].
func FuzzParse(f *testing.F) {
	for _, s := range []string{"* * * * *", "*/5 * * * * *", "@every 1s", "@daily", "30 2 * * MON-FRI", "0 0 29 2 *"} {
		f.Add(s, "Europe/Berlin", int64(3600))
	}
	f.Fuzz(func(t *testing.T, expr, tz string, missedSeconds int64) {
		s, err := Parse(expr, tz)
		if err != nil {
			return
		}
		from := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
		due := s.Next(from)
		if due.IsZero() || !due.After(from) {
			t.Fatalf("%q: Next(%s) = %s", expr, from, due)
		}
		missed := time.Duration(missedSeconds%(400*24*3600)) * time.Second
		if missed < 0 {
			missed = -missed
		}
		now := due.Add(missed)
		latest := s.Latest(due, now)
		if latest.Before(due) || latest.After(now) {
			t.Fatalf("%q: Latest(%s, %s) = %s", expr, due, now, latest)
		}
	})
}
