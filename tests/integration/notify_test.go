package integration

import (
	"context"
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

// wakeCount reads the wake-up counter.
func (b *lifecycleBundle) wakeCount() int64 {
	b.t.Helper()
	var n int64
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.wake_count()`).Scan(&n))
	return n
}

// SPEC §6 as amended (sql/045_notify.sql): a change that can make steps ready now advances the wake-up counter in
// its transaction, and no writing transaction sends a NOTIFY (its commit would wait for every other notifying
// commit of the cluster). Each case: the counter moves exactly when a step became claimable now, and nothing
// arrives on stepready_ready. Before schema version 21 every "true" case sent a notification and none moved a
// counter (the function did not exist).
func TestWakeUpsStepreadyReady(t *testing.T) {
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
		{"task created by plain INSERTs", func(b *lifecycleBundle) (int64, func()) {
			return 0, func() {
				require.NoError(b.t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
					var id int64
					if err := tx.QueryRow(b.ctx, `INSERT INTO stepready.tasks (name) VALUES ('t') RETURNING id`).Scan(&id); err != nil {
						return err
					}
					_, err := tx.Exec(b.ctx, `INSERT INTO stepready.steps (task_id, name, handler) VALUES ($1, 'a', 'h')`, id)
					return err
				}))
			}
		}, true},
		{"task created with a future run_at", func(b *lifecycleBundle) (int64, func()) {
			return 0, func() {
				b.task(`{"name": "t", "run_at": "2200-01-01T00:00:00Z", "steps": [{"name": "a", "handler": "h"}]}`)
			}
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
			_, action := tc.setup(b)
			l.drain()
			before := b.wakeCount()

			action()
			after := b.wakeCount()
			if tc.notify {
				require.Greater(t, after, before, "the wake-up counter moves")
			} else {
				require.Equal(t, before, after, "the wake-up counter stays")
			}
			l.requireNone() // no NOTIFY inside a writing transaction
		})
	}
}

// wake_daemons is the NOTIFY sent after a commit: its payload is the task id (0 for none), and in a transaction
// that has written nothing it makes that transaction's commit asynchronous (it holds the notify lock without
// waiting for the WAL flush), while a transaction that has written keeps its durable commit.
func TestWakeDaemons(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	l := b.listen()
	l.drain()
	b.exec(`SELECT stepready.wake_daemons($1)`, int64(42))
	require.Equal(t, "42", l.next())
	b.exec(`SELECT stepready.wake_daemons()`)
	require.Equal(t, "0", l.next())
	l.requireNone()

	cases := []struct {
		name  string
		write bool
		want  string
	}{
		{"a transaction of its own: asynchronous commit", false, "off"},
		{"after a write in the same transaction: the commit stays durable", true, "on"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := b.db.Pool.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			_, err = tx.Exec(b.ctx, `SET LOCAL synchronous_commit = on`)
			require.NoError(t, err)
			if tc.write {
				_, err = tx.Exec(b.ctx, `SELECT stepready.create_task('{"name": "t", "steps": [{"name": "s", "handler": "h"}]}')`)
				require.NoError(t, err)
			}
			_, err = tx.Exec(b.ctx, `SELECT stepready.wake_daemons(7)`)
			require.NoError(t, err)
			var got string
			require.NoError(t, tx.QueryRow(b.ctx, `SHOW synchronous_commit`).Scan(&got))
			require.Equal(t, tc.want, got)
			require.NoError(t, tx.Commit(b.ctx))
			require.Equal(t, "7", l.next())
		})
	}
}
