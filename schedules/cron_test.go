package schedules

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestParseErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ cron, tz, want string }{
		{"", "UTC", "cron: is required"},
		{"61 * * * *", "UTC", `cron "61 * * * *"`},
		{"* * *", "UTC", `cron "* * *"`},
		{"@fortnightly", "UTC", `cron "@fortnightly"`},
		{"0 0 30 2 *", "UTC", "never fires"},
		{"CRON_TZ=Europe/Berlin 0 2 * * *", "UTC", "timezone field"},
		{"0 2 * * *", "Mars/Olympus", `timezone "Mars/Olympus"`},
		{"0 2 * * *", "Local", `timezone "Local"`},
		{"@every 500ms", "UTC", `cron "@every 500ms": @every takes whole seconds, at least 1s`},
		{"@every 1500ms", "UTC", "whole seconds"},
		{"@every 2.5s", "UTC", "whole seconds"},
		{"@every 0s", "UTC", "whole seconds"},
	} {
		_, err := Parse(tc.cron, tc.tz)
		require.ErrorIs(t, err, ErrInvalid, tc.cron)
		require.ErrorContains(t, err, tc.want, tc.cron)
	}
}

func TestNext(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, cron, tz, from string
		want                 []string
	}{
		{"five fields", "*/15 * * * *", "UTC", "2026-11-24T10:07:00Z",
			[]string{"2026-11-24T10:15:00Z", "2026-11-24T10:30:00Z", "2026-11-24T10:45:00Z"}},
		{"six fields, seconds first", "*/20 * * * * *", "UTC", "2026-11-24T10:00:05Z",
			[]string{"2026-11-24T10:00:20Z", "2026-11-24T10:00:40Z", "2026-11-24T10:01:00Z"}},
		{"@every 1s", "@every 1s", "UTC", "2026-11-24T10:00:00.400Z",
			[]string{"2026-11-24T10:00:01Z", "2026-11-24T10:00:02Z", "2026-11-24T10:00:03Z"}},
		{"@every 90m keeps its phase", "@every 90m", "UTC", "2026-11-24T10:00:00Z",
			[]string{"2026-11-24T11:30:00Z", "2026-11-24T13:00:00Z", "2026-11-24T14:30:00Z"}},
		{"@hourly", "@hourly", "UTC", "2026-11-24T10:00:00Z",
			[]string{"2026-11-24T11:00:00Z", "2026-11-24T12:00:00Z"}},
		{"@daily in a zone", "@daily", "America/New_York", "2026-11-24T10:00:00Z",
			[]string{"2026-11-25T05:00:00Z", "2026-11-26T05:00:00Z"}},
		// Europe/Berlin, spring forward on 2026-03-29 (02:00 CET → 03:00 CEST): 02:30 does not exist that day
		// and robfig/cron skips the day; the fires around it stay at 02:30 local time.
		{"DST spring: the missing 02:30 is skipped", "30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z",
			[]string{"2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"}},
		// Autumn back on 2026-10-25 (03:00 CEST → 02:00 CET): 02:30 happens twice and robfig/cron fires at both,
		// an hour apart (two fire times, two idempotency keys, two tasks).
		{"DST autumn: the repeated 02:30 fires twice", "30 2 * * *", "Europe/Berlin", "2026-10-23T12:00:00Z",
			[]string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := Parse(tc.cron, tc.tz)
			require.NoError(t, err)
			var got []string
			for _, f := range s.Preview(time.Time{}, utc(tc.from), len(tc.want)) {
				got = append(got, f.Format(time.RFC3339))
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// Latest: after a period without a daemon only the latest missed fire time fires.
func TestLatest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, cron, due, now, want string
	}{
		{"not yet due", "*/5 * * * *", "2026-11-24T10:05:00Z", "2026-11-24T10:04:59Z", "2026-11-24T10:05:00Z"},
		{"due exactly", "*/5 * * * *", "2026-11-24T10:05:00Z", "2026-11-24T10:05:00Z", "2026-11-24T10:05:00Z"},
		{"one missed", "*/5 * * * *", "2026-11-24T10:05:00Z", "2026-11-24T10:09:59Z", "2026-11-24T10:05:00Z"},
		{"several missed", "*/5 * * * *", "2026-11-24T10:05:00Z", "2026-11-24T12:07:00Z", "2026-11-24T12:05:00Z"},
		{"per second, a year missed", "* * * * * *", "2025-11-24T10:00:00Z", "2026-11-24T10:00:00.5Z",
			"2026-11-24T10:00:00Z"},
		{"@every keeps phase", "@every 7s", "2026-11-24T10:00:00Z", "2026-11-24T10:01:00Z", "2026-11-24T10:00:56Z"},
		{"@every 1s a year missed", "@every 1s", "2025-11-24T10:00:00Z", "2026-11-24T10:00:00.9Z",
			"2026-11-24T10:00:00Z"},
		{"yearly", "0 0 1 1 *", "2020-01-01T00:00:00Z", "2026-11-24T10:00:00Z", "2026-01-01T00:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := Parse(tc.cron, "UTC")
			require.NoError(t, err)
			now, err := time.Parse(time.RFC3339Nano, tc.now)
			require.NoError(t, err)
			require.Equal(t, tc.want, s.Latest(utc(tc.due), now).Format(time.RFC3339))
		})
	}
}
