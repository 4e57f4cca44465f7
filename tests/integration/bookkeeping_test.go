package integration

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// bookkeepingViolations lists every step row that breaks one of the bookkeeping invariants kept by the steps
// BEFORE UPDATE trigger, or by the hot-path functions in its place (the trigger's WHEN clause skips rows whose
// update already did the work):
//   - completed_at is set exactly when the state is terminal;
//   - a lease (owner and expiry) is held exactly while the step is enqueued or in_progress;
//   - a step in a claimable state carries its task's hold (paused, or status not pending/in_progress) and priority;
//   - updated_at has moved whenever the row changed since the snapshot `before` (ids and updated_at).
func (b *lifecycleBundle) bookkeepingViolations(before map[int64]time.Time, snapshots map[int64]string) []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT s.id, s.updated_at, row(s.*)::text,
		       concat_ws('; ',
		           CASE WHEN (s.state IN ('complete', 'error', 'skipped', 'cancelled', 'resolved_manually'))
		                     <> (s.completed_at IS NOT NULL)
		                THEN format('state %s with completed_at %s', s.state, s.completed_at) END,
		           -- In flight means leased; a lease outside flight is an orphaned one (a running attempt an
		           -- operator moved out of flight), so a step that was never started has none.
		           CASE WHEN (s.state IN ('enqueued', 'in_progress') AND s.lease_expires_at IS NULL)
		                  OR (s.lease_owner IS NULL) <> (s.lease_expires_at IS NULL)
		                  OR (s.state NOT IN ('enqueued', 'in_progress') AND s.lease_expires_at IS NOT NULL
		                      AND s.fence_token = 0)
		                THEN format('state %s with lease %s until %s', s.state, s.lease_owner, s.lease_expires_at) END,
		           CASE WHEN s.state IN ('pending', 'waiting_for_retry')
		                 AND (s.task_held <> (t.paused OR t.status NOT IN ('pending', 'in_progress'))
		                      OR s.task_priority <> t.priority)
		                THEN format('claimable with task_held %s, task_priority %s; task %s paused %s priority %s',
		                            s.task_held, s.task_priority, t.status, t.paused, t.priority) END) AS why
		  FROM stepready.steps s JOIN stepready.tasks t ON t.id = s.task_id
		 ORDER BY s.id`)
	require.NoError(b.t, err)
	defer rows.Close()
	var bad []string
	for rows.Next() {
		var id int64
		var updated time.Time
		var snap, why string
		require.NoError(b.t, rows.Scan(&id, &updated, &snap, &why))
		if why != "" {
			bad = append(bad, why)
		}
		if prev, ok := snapshots[id]; ok && prev != snap && !updated.After(before[id]) {
			bad = append(bad, "step changed without moving updated_at: "+snap)
		}
		before[id], snapshots[id] = updated, snap
	}
	require.NoError(b.t, rows.Err())
	return bad
}

// TestStepBookkeepingInvariants drives steps through every lifecycle and operator function, each write in its
// own transaction, and checks the bookkeeping invariants of every row after each one.
func TestStepBookkeepingInvariants(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	before, snaps := map[int64]time.Time{}, map[int64]string{}
	check := func(what string) {
		t.Helper()
		require.Empty(t, b.bookkeepingViolations(before, snaps), "after %s", what)
	}

	task, ids := b.task(`{"name": "book", "priority": 3, "retry": {"max_attempts": 3, "backoff": "fixed", "base_delay_ms": 0},
		"steps": [
			{"name": "a", "handler": "h"},
			{"name": "b", "handler": "h", "depends_on": ["a"], "on_exhausted": "skip_cascade", "retry": {"max_attempts": 1}},
			{"name": "c", "handler": "h", "depends_on": ["b"]},
			{"name": "poll", "handler": "h", "max_iterations": 2},
			{"name": "gone", "handler": "h", "on_exhausted": "skip"}]}`)
	check("create_task")

	// claim_and_start_steps takes a, poll and gone; one fails into a zero-delay retry, one completes.
	started := b.claimAndStart(10, at)
	require.Len(t, started, 3)
	check("claim_and_start_steps")
	require.Equal(t, "waiting_for_retry", *b.fail(ids["a"], 1, `{"class": "transient"}`, at, 0).State)
	check("fail_step (retry)")
	require.True(t, b.boolCall(`SELECT stepready.continue_step($1, 1, '{"page": 1}', NULL, 0, $2)`, ids["poll"], at))
	check("continue_step (next iteration)")
	require.Equal(t, "skipped", *b.fail(ids["gone"], 1, `{"class": "permanent"}`, at, 0).State)
	check("fail_step (skip)")

	// claim_ready_steps + start_steps + release_step + heartbeat, then complete_steps.
	claimed := b.claim(10, at)
	require.Len(t, claimed, 2)
	check("claim_ready_steps")
	require.True(t, b.boolCall(`SELECT stepready.release_step($1, NULL, $2)`, ids["poll"], at))
	check("release_step (enqueued)")
	starts := b.startSteps([]int64{ids["a"]}, at)
	require.Equal(t, 2, *starts[ids["a"]].Attempt)
	check("start_steps")
	require.True(t, b.boolCall(`SELECT stepready.heartbeat_step($1, 2, 1000, $2)`, ids["a"], at))
	check("heartbeat_step")
	done, err := b.completeSteps([]int64{ids["a"]}, []int{2}, []string{`{}`}, at)
	require.NoError(t, err)
	require.True(t, done[ids["a"]])
	check("complete_steps")

	// Pausing holds the claimable steps; resuming releases them; a priority change follows them.
	require.True(t, b.boolCall(`SELECT stepready.pause_task($1, $2)`, task, at))
	check("pause_task")
	require.True(t, b.boolCall(`SELECT stepready.resume_task($1, $2)`, task, at))
	check("resume_task")
	b.exec(`UPDATE stepready.tasks SET priority = 7 WHERE id = $1`, task)
	check("task priority change")

	// b exhausts its one attempt: skip_cascade skips c too; the reaper fails poll's expired lease.
	started = b.claimAndStart(10, at)
	require.Len(t, started, 2)
	check("claim_and_start_steps (b, poll)")
	require.Equal(t, "skipped", *b.fail(ids["b"], 1, `{"class": "transient"}`, at, 0).State)
	check("fail_step (skip_cascade)")
	require.Equal(t, 1, b.reap(at.Add(testLease+time.Second), 100))
	check("reap_expired_leases (in_progress)")

	// Operators: retry now, resolve, reset, cancel.
	require.True(t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, ids["poll"], at.Add(testLease+time.Second)))
	check("retry_step_now")
	require.True(t, b.boolCall(`SELECT stepready.resolve_step($1, '{"by": "hand"}', $2)`, ids["c"], at.Add(2*testLease)))
	check("resolve_step")
	b.intCall(`SELECT stepready.reset_task($1, $2)`, task, at.Add(2*testLease))
	check("reset_task")
	b.intCall(`SELECT stepready.cancel_task($1, 'enough', $2)`, task, at.Add(2*testLease))
	check("cancel_task")

	// A plain UPDATE by hand keeps the invariants too (the trigger does the work the statement left out).
	other, oids := b.task(`{"name": "by-hand", "steps": [{"name": "s", "handler": "h"}]}`)
	b.exec(`UPDATE stepready.steps SET state = 'in_progress', attempts = 1, lease_owner = 'w',
		lease_expires_at = $2 WHERE id = $1`, oids["s"], at.Add(time.Minute))
	check("UPDATE to in_progress by hand")
	b.exec(`UPDATE stepready.steps SET state = 'complete' WHERE id = $1`, oids["s"])
	check("UPDATE to complete by hand")
	b.requireStatus(other, "complete")
	// Moving a running step out of flight by hand is an operator's action like cancel_task: the attempt keeps its
	// lease, orphaned, until its worker reports (the refused report ends it) or the lease expires.
	require.Equal(t, 1, b.step(oids["s"]).FenceToken, "the token follows the attempts set by hand")
	require.NotNil(t, b.step(oids["s"]).LeaseExpiresAt)
	require.False(t, b.complete(oids["s"], 1, `{}`, at))
	check("the orphaned attempt's report")
	require.Nil(t, b.step(oids["s"]).LeaseExpiresAt)
}

// TestHotPathSkipsTheRowTrigger: claiming, starting, completing and failing a batch do their own bookkeeping, so
// the steps BEFORE UPDATE trigger function (a PL/pgSQL call per row) never runs for them; a plain UPDATE that
// leaves the bookkeeping to it still calls it. Each call runs in its own transaction, as the daemon's do.
func TestHotPathSkipsTheRowTrigger(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	for range 3 {
		b.task(`{"name": "hot", "steps": [{"name": "s", "handler": "h"}, {"name": "t", "handler": "h"}]}`)
	}
	// calls runs sql in a transaction of its own and returns how many times it called the trigger function.
	calls := func(sql string, args ...any) int64 {
		t.Helper()
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		_, err = tx.Exec(b.ctx, `SET LOCAL track_functions = 'pl'`)
		require.NoError(t, err)
		_, err = tx.Exec(b.ctx, sql, args...)
		require.NoError(t, err)
		var n *int64
		require.NoError(t, tx.QueryRow(b.ctx,
			`SELECT pg_stat_get_xact_function_calls('stepready._steps_before_update'::regproc)`).Scan(&n))
		require.NoError(t, tx.Commit(b.ctx))
		if n == nil {
			return 0
		}
		return *n
	}
	var ids []int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT array_agg(id ORDER BY id) FROM stepready.steps`).Scan(&ids))
	require.Len(t, ids, 6)

	require.Zero(t, calls(`SELECT * FROM stepready.claim_and_start_steps(4, 'w', 60000, $1)`, at))
	require.Zero(t, calls(`SELECT * FROM stepready.claim_ready_steps(2, 'w', 60000, $1)`, at))
	require.Zero(t, calls(`SELECT * FROM stepready.start_steps($1, 'w', 60000, $2)`, ids[4:], at))
	require.Zero(t, calls(`SELECT * FROM stepready.complete_steps($1, '{1,1,1}', '{"{}","{}","{}"}', $2)`, ids[:3], at))
	// One failure is retried (the step re-enters a claimable state: task_held and task_priority are copied from
	// the task by fail_steps itself), one is permanent.
	require.Zero(t, calls(`SELECT * FROM stepready.fail_steps($1, '{1,1}',
		'{"{\"class\": \"transient\"}","{\"class\": \"permanent\"}"}', $2)`, ids[3:5], at))
	var states []string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT array_agg(state ORDER BY id) FROM stepready.steps WHERE id = ANY ($1)`,
		ids[3:5]).Scan(&states))
	require.Equal(t, []string{"waiting_for_retry", "error"}, states)
	require.Equal(t, int64(1), calls(`UPDATE stepready.steps SET input = '{"x": 1}' WHERE id = $1`, ids[5]),
		"a plain UPDATE leaves updated_at to the trigger")
}
