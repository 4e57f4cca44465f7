package maintenance_test

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/maintenance"
	"github.com/stepready/stepready/schedules"
)

type schedBundle struct {
	*testBundle
	e *maintenance.ScheduleEnqueuer
}

func schedSetup(t *testing.T) *schedBundle {
	t.Helper()
	b := &schedBundle{testBundle: setup(t)}
	b.e = b.enqueuer()
	return b
}

func (b *schedBundle) enqueuer() *maintenance.ScheduleEnqueuer {
	b.t.Helper()
	e, err := maintenance.NewScheduleEnqueuer(b.env, maintenance.ScheduleEnqueuerConfig{})
	require.NoError(b.t, err)
	return e
}

func (b *schedBundle) template(name string) {
	b.t.Helper()
	b.exec(`INSERT INTO stepready.task_templates (name, version, definition) VALUES ($1, 1, $2)`, name,
		`{"context": {"from": "template", "keep": 1}, "steps": [{"name": "s", "handler": "noop"}]}`)
}

func (b *schedBundle) put(d schedules.Definition) {
	b.t.Helper()
	_, err := schedules.Put(b.ctx, b.db.Pool, d, false)
	require.NoError(b.t, err)
}

func (b *schedBundle) round() maintenance.ScheduleRound {
	b.t.Helper()
	r, err := b.e.RunOnce(b.ctx)
	require.NoError(b.t, err)
	return r
}

func (b *schedBundle) get(name string) schedules.Schedule {
	b.t.Helper()
	s, err := schedules.Get(b.ctx, b.db.Pool, name)
	require.NoError(b.t, err)
	return s
}

// A due schedule fires once, for its latest missed fire time, with the idempotency key schedule:NAME:FIRE_TIME
// and the schedule's context over the template's; concurrent enqueuers create exactly one task.
func TestScheduleFiresOncePerFireTime(t *testing.T) {
	t.Parallel()
	b := schedSetup(t)
	b.template("nightly")
	b.put(schedules.Definition{Name: "n", Template: "nightly", Cron: "@hourly",
		Context: json.RawMessage(`{"from": "schedule"}`)})
	// Missed three hours: only the latest fire time (the start of this hour) fires.
	b.exec(`UPDATE stepready.schedules SET next_fire_at = date_trunc('hour', now()) - interval '3 hours'`)
	var hour time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT date_trunc('hour', now())`).Scan(&hour))

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_, err := b.enqueuer().RunOnce(b.ctx)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	b.round()

	rows, err := b.db.Pool.Query(b.ctx, `SELECT idempotency_key, context::text FROM stepready.tasks ORDER BY id`)
	require.NoError(t, err)
	type task struct {
		Key     string
		Context string
	}
	var tasks []task
	for rows.Next() {
		var tk task
		require.NoError(t, rows.Scan(&tk.Key, &tk.Context))
		tasks = append(tasks, tk)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []task{{"schedule:n:" + hour.UTC().Format(time.RFC3339), `{"from": "schedule", "keep": 1}`}}, tasks)
	s := b.get("n")
	require.True(t, hour.Equal(*s.LastFiredAt))
	require.True(t, hour.Add(time.Hour).Equal(*s.NextFireAt))
	require.Nil(t, s.LastError)
}

// overlap: skip records the fire time and creates nothing while the previous task runs.
func TestScheduleOverlapSkip(t *testing.T) {
	t.Parallel()
	b := schedSetup(t)
	b.template("job")
	b.put(schedules.Definition{Name: "s", Template: "job", Cron: "@every 1h", Overlap: schedules.OverlapSkip})
	// Each round's fire time is distinct: due - 1h + k×1h = now - 30, 20, 10 minutes.
	due := func(minutes int) {
		b.exec(`UPDATE stepready.schedules SET next_fire_at = date_trunc('second', now()) - make_interval(mins => $1)`,
			minutes)
	}
	due(90)
	require.Equal(t, 1, b.round().Fired)
	first := *b.get("s").LastTaskID

	due(80)
	r := b.round()
	require.Equal(t, 1, r.Skipped)
	s := b.get("s")
	require.Equal(t, int64(1), s.SkippedCount)
	require.NotNil(t, s.LastSkippedAt)
	require.Equal(t, first, *s.LastTaskID)
	require.Equal(t, int64(1), int64(b.count(`SELECT count(*) FROM stepready.tasks`)))

	b.exec(`SELECT stepready.cancel_task($1, 'done')`, first)
	due(70)
	require.Equal(t, 1, b.round().Fired, "a terminal previous task lets it fire")
	require.Equal(t, int64(2), int64(b.count(`SELECT count(*) FROM stepready.tasks`)))
}

// A missing template is reported (last_error, never a crash) and fires once it exists; a bad cron inserted by
// plain SQL is reported too, and a schedule inserted by plain SQL gets its first fire time.
func TestScheduleErrorsAreReportedAndRecover(t *testing.T) {
	t.Parallel()
	b := schedSetup(t)
	b.put(schedules.Definition{Name: "m", Template: "later", Cron: "@hourly"})
	b.exec(`UPDATE stepready.schedules SET next_fire_at = now() - interval '1 second'`)
	r := b.round()
	require.Equal(t, 1, r.Failed)
	s := b.get("m")
	require.Contains(t, *s.LastError, `template "later": template "later" does not exist`)
	require.Equal(t, 0, b.round().Failed, "retried only after ErrorRetry")

	b.template("later")
	b.exec(`UPDATE stepready.schedules SET last_error_at = now() - interval '1 minute'`)
	require.Equal(t, 1, b.round().Fired)
	require.Nil(t, b.get("m").LastError)

	b.exec(`INSERT INTO stepready.schedules (name, template, cron, timezone) VALUES ('bad', 'later', '99 * * * *', 'UTC'),
		('tz', 'later', '@hourly', 'Nowhere/Land'), ('plain', 'later', '@daily', 'UTC')`)
	r = b.round()
	require.Equal(t, 2, r.Failed)
	require.Contains(t, *b.get("bad").LastError, `cron "99 * * * *"`)
	require.Contains(t, *b.get("tz").LastError, `timezone "Nowhere/Land"`)
	require.NotNil(t, b.get("plain").NextFireAt)
	require.Nil(t, b.get("plain").LastError)
}

// While another instance holds the round, this one fires nothing and sleeps at least a little (the other is
// firing what is due).
func TestScheduleEnqueuerElectsOneInstancePerRound(t *testing.T) {
	t.Parallel()
	b := schedSetup(t)
	b.template("job")
	b.put(schedules.Definition{Name: "j", Template: "job", Cron: "@hourly"})
	b.exec(`UPDATE stepready.schedules SET next_fire_at = now() - interval '1 second'`)
	release := b.holdLock(maintenance.LockScheduleEnqueuer)
	r := b.round()
	require.False(t, r.Leader)
	require.Zero(t, r.Fired)
	require.GreaterOrEqual(t, r.Wait, 200*time.Millisecond)
	release()
	r = b.round()
	require.True(t, r.Leader)
	require.Equal(t, 1, r.Fired)
}
