package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/maintenance"
	"github.com/stepready/stepready/schedules"
	"github.com/stepready/stepready/steps"
)

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

func (b *bundle) putSchedule(t *testing.T, d schedules.Definition) {
	t.Helper()
	_, err := schedules.Put(context.Background(), b.db.Pool, d, false)
	require.NoError(t, err)
}

// fireTimes returns the fire times of the tasks schedule name created, in order, read from their idempotency
// keys (schedule:NAME:FIRE_TIME).
func (b *bundle) fireTimes(t *testing.T, name string) []time.Time {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT idempotency_key FROM stepready.tasks
		WHERE idempotency_key LIKE $1 ORDER BY idempotency_key`, "schedule:"+name+":%")
	require.NoError(t, err)
	var out []time.Time
	for rows.Next() {
		var key string
		require.NoError(t, rows.Scan(&key))
		ft, err := time.Parse(time.RFC3339, strings.TrimPrefix(key, "schedule:"+name+":"))
		require.NoError(t, err, key)
		out = append(out, ft)
	}
	require.NoError(t, rows.Err())
	return out
}

// waitFires polls until schedule name has created at least n tasks.
func (b *bundle) waitFires(t *testing.T, name string, n int, timeout time.Duration) []time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := b.fireTimes(t, name)
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule %s: %d tasks after %s, want %d", name, len(got), timeout, n)
		}
		<-time.After(50 * time.Millisecond)
	}
}

// requireEverySecond checks consecutive fire times maxGap apart at most, never equal.
func requireSpacing(t *testing.T, fires []time.Time, maxGap time.Duration) {
	t.Helper()
	for i := 1; i < len(fires); i++ {
		d := fires[i].Sub(fires[i-1])
		require.True(t, d > 0 && d <= maxGap, "fire %d at %s, %s after the previous: %v", i, fires[i], d, fires)
	}
}

const tickTemplate = `{"steps": [{"name": "s", "handler": "noop"}]}`

// Two daemons, `@every 1s` for a few seconds: one task per fire time, none missing, none duplicated (the
// idempotency key is unique, so a duplicate would be the same task; a gap would show in the keys).
func TestScheduleEverySecondTwoDaemons(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.exec(t, `INSERT INTO stepready.task_templates (name, version, definition) VALUES ('tick', 1, $1)`, tickTemplate)
			for i := range 2 {
				b.start(t, stepready.Config{Dispatch: mode, WorkerID: fmt.Sprintf("d%d", i),
					PollInterval: 200 * time.Millisecond})
			}
			b.putSchedule(t, schedules.Definition{Name: "tick", Template: "tick", Cron: "@every 1s",
				Context: []byte(`{"via": "schedule"}`)})
			fires := b.waitFires(t, "tick", 4, 30*time.Second)
			requireSpacing(t, fires, time.Second)

			// The tasks run (the daemons claim them) with the schedule's context.
			var done int
			deadline := time.Now().Add(30 * time.Second)
			for {
				require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM stepready.tasks
					WHERE status = 'complete' AND context ->> 'via' = 'schedule'`).Scan(&done))
				if done >= 4 {
					break
				}
				require.False(t, time.Now().After(deadline), "scheduled tasks did not complete: %d", done)
				<-time.After(50 * time.Millisecond)
			}
		})
	}
}

// overlap: skip creates nothing while the previous task runs, and records the skipped fire times.
func TestScheduleOverlapSkip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	b.reg.MustRegister("hold", steps.HandlerFunc(func(ctx context.Context, _ *steps.Step) (any, error) {
		select {
		case <-release:
			return "ok", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}))
	b.exec(t, `INSERT INTO stepready.task_templates (name, version, definition) VALUES ('hold', 1,
		'{"steps": [{"name": "s", "handler": "hold", "timeout_ms": 60000}]}')`)
	b.start(t, stepready.Config{Dispatch: stepready.DispatchDirect, PollInterval: 200 * time.Millisecond})
	b.putSchedule(t, schedules.Definition{Name: "hold", Template: "hold", Cron: "@every 1s",
		Overlap: schedules.OverlapSkip})
	b.waitFires(t, "hold", 1, 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := schedules.Get(context.Background(), b.db.Pool, "hold")
		require.NoError(t, err)
		if s.SkippedCount >= 2 {
			break
		}
		require.False(t, time.Now().After(deadline), "no skipped fires recorded")
		<-time.After(50 * time.Millisecond)
	}
	require.Len(t, b.fireTimes(t, "hold"), 1, "nothing created while the previous task runs")
	close(release)
	b.waitFires(t, "hold", 2, 30*time.Second)
}

// A schedule whose template is missing is reported (last_error, the leader keeps running) and fires once the
// template exists.
func TestScheduleMissingTemplateRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, stepready.Config{Dispatch: stepready.DispatchDirect, PollInterval: 200 * time.Millisecond})
	b.putSchedule(t, schedules.Definition{Name: "later", Template: "later", Cron: "@every 1s"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := schedules.Get(context.Background(), b.db.Pool, "later")
		require.NoError(t, err)
		if s.LastError != nil {
			require.Contains(t, *s.LastError, `template "later" does not exist`)
			break
		}
		require.False(t, time.Now().After(deadline), "the error was not reported")
		<-time.After(50 * time.Millisecond)
	}
	b.exec(t, `INSERT INTO stepready.task_templates (name, version, definition) VALUES ('later', 1, $1)`, tickTemplate)
	// Retried ErrorRetryDefault after the failure.
	b.waitFires(t, "later", 1, maintenance.ScheduleErrorRetryDefault+20*time.Second)
	s, err := schedules.Get(context.Background(), b.db.Pool, "later")
	require.NoError(t, err)
	require.Nil(t, s.LastError)
}

// Leader failover: two daemon processes fire `@every 1s`; one is killed (SIGKILL) and the other keeps firing,
// without a duplicate and without a gap longer than one interval.
func TestScheduleLeaderFailover(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.exec(t, `INSERT INTO stepready.task_templates (name, version, definition) VALUES ('tick', 1,
				'{"steps": [{"name": "s", "handler": "block"}]}')`)
			first := startChild(t, b, mode)
			startChild(t, b, mode)
			b.putSchedule(t, schedules.Definition{Name: "tick", Template: "tick", Cron: "@every 1s"})
			before := b.waitFires(t, "tick", 3, 30*time.Second)
			require.NoError(t, first.Process.Kill())
			_ = first.Wait()
			fires := b.waitFires(t, "tick", len(before)+4, 30*time.Second)
			// At most one fire time lost while the survivor notices (catch-up fires only the latest).
			requireSpacing(t, fires, 2*time.Second)
			gaps := 0
			for i := 1; i < len(fires); i++ {
				if fires[i].Sub(fires[i-1]) > time.Second {
					gaps++
				}
			}
			require.LessOrEqual(t, gaps, 1, "%v", fires)
		})
	}
}

// run_at through the daemon: the step is not started before run_at.
func TestRunAtDelaysStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, stepready.Config{Dispatch: stepready.DispatchDirect, PollInterval: 5 * time.Second})
	var id int64
	var runAt time.Time
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT stepready.create_task(jsonb_build_object(
		'name', 'later', 'run_at', to_char((now() + interval '1500 ms') AT TIME ZONE 'UTC',
		'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), 'steps', jsonb_build_array(jsonb_build_object('name', 's', 'handler', 'noop'))))`).
		Scan(&id))
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT run_at FROM stepready.tasks WHERE id = $1`, id).Scan(&runAt))
	b.waitTask(t, id, 30*time.Second, "complete")
	var started time.Time
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT min(e.at) FROM stepready.step_events e
		JOIN stepready.steps s ON s.id = e.step_id WHERE s.task_id = $1 AND e.event = 'attempt.started'`, id).Scan(&started))
	require.False(t, started.Before(runAt), "started %s, run_at %s", started, runAt)
	// Woken by the timer at run_at, not by the 5 s poll.
	require.Less(t, started.Sub(runAt), 2*time.Second)
}
