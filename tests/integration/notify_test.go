package integration

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The notify trigger can only compare next_attempt_at with the database clock (it does not see p_as_of), so
// these tests pin time far from today on purpose: pastTime for changes that make a step due now, farFuture for
// a backoff that certainly ends after the real clock.
var (
	pastTime  = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	farFuture = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

const sentinelPayload = "sentinel"

// listener is a dedicated connection listening on stepready_ready.
type listener struct {
	b    *lifecycleBundle
	conn *pgx.Conn
}

func (b *lifecycleBundle) listen() *listener {
	b.t.Helper()
	conn := b.db.Conn(b.t)
	_, err := conn.Exec(b.ctx, `LISTEN stepready_ready`)
	require.NoError(b.t, err)
	return &listener{b: b, conn: conn}
}

// next waits for the next notification on stepready_ready and returns its payload.
func (l *listener) next() string {
	l.b.t.Helper()
	ctx, cancel := context.WithTimeout(l.b.ctx, 10*time.Second)
	defer cancel()
	n, err := l.conn.WaitForNotification(ctx)
	require.NoError(l.b.t, err, "no notification on stepready_ready")
	require.Equal(l.b.t, "stepready_ready", n.Channel)
	return n.Payload
}

// sentinel sends a marker notification in a transaction of its own. Notifications are delivered in commit order,
// so whatever arrives before the marker was sent before it.
func (l *listener) sentinel() {
	l.b.t.Helper()
	l.b.exec(`SELECT pg_notify('stepready_ready', $1)`, sentinelPayload)
}

// drain discards every notification sent so far.
func (l *listener) drain() {
	l.b.t.Helper()
	l.sentinel()
	for l.next() != sentinelPayload {
	}
}

// requireNone requires that nothing was notified since the last drain.
func (l *listener) requireNone() {
	l.b.t.Helper()
	l.sentinel()
	require.Equal(l.b.t, sentinelPayload, l.next(), "unexpected notification")
}

func TestNotifyStepreadyReady(t *testing.T) {
	t.Parallel()
	at := pastTime
	chain := `{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h", "depends_on": ["a"]}]}`
	join := `{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "x", "handler": "h"},
		{"name": "b", "handler": "h", "depends_on": ["a", "x"]}]}`

	cases := []struct {
		name string
		// setup prepares a task (nothing it notifies counts) and returns its id and the action under test.
		setup  func(b *lifecycleBundle) (int64, func())
		notify bool
	}{
		{"task created", func(b *lifecycleBundle) (int64, func()) {
			return 0, func() { b.task(chain) }
		}, true},
		{"parent completed: the child becomes ready", func(b *lifecycleBundle) (int64, func()) {
			taskID, ids := b.task(chain)
			attempt := b.run(ids["a"], at)
			return taskID, func() { require.True(b.t, b.complete(ids["a"], attempt, `{}`, at)) }
		}, true},
		{"parent completed, the child still waits on another parent", func(b *lifecycleBundle) (int64, func()) {
			taskID, ids := b.task(join)
			attempt := b.run(ids["a"], at)
			b.run(ids["x"], at)
			return taskID, func() { require.True(b.t, b.complete(ids["a"], attempt, `{}`, at)) }
		}, false},
		{"last step completed", func(b *lifecycleBundle) (int64, func()) {
			taskID, step := b.oneStep("")
			attempt := b.run(step, at)
			return taskID, func() { require.True(b.t, b.complete(step, attempt, `{}`, at)) }
		}, false},
		{"zero-delay retry", func(b *lifecycleBundle) (int64, func()) {
			taskID, step := b.oneStep(`"retry": {"backoff": "fixed", "base_delay_ms": 0}`)
			attempt := b.run(step, at)
			return taskID, func() {
				r := b.fail(step, attempt, `{"class": "transient"}`, at, 0)
				requireTime(b.t, at, r.NextAttemptAt, "next_attempt_at")
			}
		}, true},
		{"retry_after_ms 0", func(b *lifecycleBundle) (int64, func()) {
			taskID, step := b.oneStep("")
			attempt := b.run(step, at)
			return taskID, func() { b.fail(step, attempt, `{"class": "rate_limited", "retry_after_ms": 0}`, at, 0) }
		}, true},
		{"retry with a future backoff", func(b *lifecycleBundle) (int64, func()) {
			taskID, step := b.oneStep("")
			attempt := b.run(step, at)
			return taskID, func() {
				r := b.fail(step, attempt, `{"class": "transient"}`, farFuture, 0)
				requireTime(b.t, farFuture.Add(time.Second), r.NextAttemptAt, "next_attempt_at")
			}
		}, false},
		{"final failure", func(b *lifecycleBundle) (int64, func()) {
			taskID, step := b.oneStep("")
			attempt := b.run(step, at)
			return taskID, func() { b.fail(step, attempt, `{"class": "permanent"}`, at, 0) }
		}, false},
		{"resume_task", func(b *lifecycleBundle) (int64, func()) {
			taskID, _ := b.oneStep("")
			require.True(b.t, b.boolCall(`SELECT stepready.pause_task($1, $2)`, taskID, at))
			return taskID, func() {
				require.True(b.t, b.boolCall(`SELECT stepready.resume_task($1, $2)`, taskID, at))
			}
		}, true},
		{"pause_task", func(b *lifecycleBundle) (int64, func()) {
			taskID, _ := b.oneStep("")
			return taskID, func() {
				require.True(b.t, b.boolCall(`SELECT stepready.pause_task($1, $2)`, taskID, at))
			}
		}, false},
		{"release_step", func(b *lifecycleBundle) (int64, func()) {
			taskID, step := b.oneStep("")
			attempt := b.run(step, at)
			return taskID, func() {
				require.True(b.t, b.boolCall(`SELECT stepready.release_step($1, $2, $3)`, step, attempt, at))
			}
		}, true},
		{"retry_step_now", func(b *lifecycleBundle) (int64, func()) {
			taskID, step := b.oneStep("")
			b.fail(step, b.run(step, at), `{"class": "permanent"}`, at, 0)
			return taskID, func() {
				require.True(b.t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, step, at))
			}
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			l := b.listen()
			taskID, action := tc.setup(b)
			l.drain()

			action()
			if !tc.notify {
				l.requireNone()
				return
			}
			if taskID == 0 { // the action created the task
				require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT max(id) FROM stepready.tasks`).Scan(&taskID))
			}
			require.Equal(t, strconv.FormatInt(taskID, 10), l.next(), "the payload is the task id")
			l.requireNone() // one message per task and transaction
		})
	}
}
