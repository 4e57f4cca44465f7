package integration

// Boundary tests of the batch lifecycle functions (claim_and_start_steps, start_steps, complete_steps) and of the
// statement-level bookkeeping they rely on (task status, children, notifications, events of deleted rows).

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// startedRow is one row of start_steps or claim_and_start_steps (the columns both have). Attempt is the fencing
// token, AttemptNumber the attempt's number within its iteration.
type startedRow struct {
	StepID        int64
	Attempt       *int
	AttemptNumber *int
	Iteration     *int
	Input         *string
	Context       *string
	Rules         *string
}

// startSteps calls start_steps and returns its rows by step id.
func (b *lifecycleBundle) startSteps(ids []int64, asOf time.Time) map[int64]startedRow {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT step_id, attempt, attempt_number, iteration, input::text AS input,
		context::text AS context, rules::text AS rules FROM stepready.start_steps($1, $2, $3, $4)`,
		ids, testWorker, testLeaseMs, asOf)
	require.NoError(b.t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[startedRow])
	require.NoError(b.t, err)
	byID := map[int64]startedRow{}
	for _, r := range got {
		_, dup := byID[r.StepID]
		require.False(b.t, dup, "start_steps returned step %d twice", r.StepID)
		byID[r.StepID] = r
	}
	require.Len(b.t, byID, len(ids), "start_steps returns one row per requested id")
	return byID
}

// completeSteps calls complete_steps and returns completed by step id.
func (b *lifecycleBundle) completeSteps(ids []int64, attempts []int, outputs []string, asOf time.Time) (map[int64]bool, error) {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT step_id, completed FROM stepready.complete_steps($1, $2, $3::jsonb[], $4)`,
		ids, attempts, outputs, asOf)
	if err != nil {
		return nil, err
	}
	got := map[int64]bool{}
	var id int64
	var ok bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &ok}, func() error {
		_, dup := got[id]
		require.False(b.t, dup, "complete_steps returned step %d twice", id)
		got[id] = ok
		return nil
	}); err != nil {
		return nil, err
	}
	return got, nil
}

// claimAndStart calls claim_and_start_steps and returns its rows in order.
func (b *lifecycleBundle) claimAndStart(limit int, asOf time.Time) []startedRow {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT step_id, attempt, attempt_number, iteration, input::text AS input,
		context::text AS context, rules::text AS rules FROM stepready.claim_and_start_steps($1, $2, $3, $4)`,
		limit, testWorker, testLeaseMs, asOf)
	require.NoError(b.t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[startedRow])
	require.NoError(b.t, err)
	return got
}

func startedIDs(rows []startedRow) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.StepID
	}
	return ids
}

// eventShape is an event without its id and time: what two equivalent histories share.
type eventShape struct {
	Event, From, To string
	Attempt         int
	Details         string
}

func shapesOf(evs []lifecycleEvent) []eventShape {
	out := make([]eventShape, len(evs))
	for i, e := range evs {
		d, _ := json.Marshal(e.Details)
		out[i] = eventShape{Event: e.Event, From: deref(e.FromState), To: deref(e.ToState),
			Attempt: deref(e.Attempt), Details: string(d)}
	}
	return out
}

// TestClaimAndStartStepsEqualsClaimThenStart runs the same fixture through claim_ready_steps + start_step and
// through claim_and_start_steps: the rows and the history must be the same, and the returned attempt is the
// fencing token complete_step accepts.
func TestClaimAndStartStepsEqualsClaimThenStart(t *testing.T) {
	t.Parallel()
	at := testBase
	def := `{"name": "t", "priority": 3, "context": {"tenant": 7}, "steps": [
		{"name": "fresh", "handler": "fetch", "input": {"url": "u"}, "timeout_ms": 5000, "queue": "q1",
		 "rules": [{"when": "true", "then": {"do": "fail"}}]},
		{"name": "retry", "handler": "load", "priority": -1},
		{"name": "child", "handler": "h", "depends_on": ["fresh"]}]}`
	prepare := func(b *lifecycleBundle) (int64, map[string]int64) {
		taskID, ids := b.task(def)
		b.retryOnce(ids["retry"], `{"class": "transient"}`, at.Add(-time.Hour))
		b.exec(`UPDATE stepready.tasks SET status = 'pending' WHERE id = $1`, taskID) // as if never claimed
		return taskID, ids
	}

	two := lifecycleSetup(t)
	taskA, idsA := prepare(two)
	claimed := two.claim(10, at)
	require.Equal(t, []int64{idsA["fresh"], idsA["retry"]}, claimedIDs(claimed))
	for _, c := range claimed {
		require.NotNil(t, two.start(c.StepID, at))
	}

	one := lifecycleSetup(t)
	taskB, idsB := prepare(one)
	got := one.claimAndStart(10, at)
	require.Equal(t, []int64{idsB["fresh"], idsB["retry"]}, startedIDs(got), "claim order")
	require.Equal(t, 1, deref(got[0].Attempt))
	require.Equal(t, 2, deref(got[1].Attempt), "the retry is the second attempt")
	require.Equal(t, `{"url": "u"}`, deref(got[0].Input))
	require.Equal(t, `{"tenant": 7}`, deref(got[0].Context))
	require.JSONEq(t, `[{"when": "true", "then": {"do": "fail"}}]`, deref(got[0].Rules))
	require.Nil(t, got[1].Rules)
	require.Equal(t, 0, deref(got[0].Iteration))

	one.requireStatus(taskB, "in_progress")
	two.requireStatus(taskA, "in_progress")
	for _, name := range []string{"fresh", "retry", "child"} {
		sa, sb := two.step(idsA[name]), one.step(idsB[name])
		sa.ID, sa.TaskID, sb.ID, sb.TaskID = 0, 0, 0, 0
		require.Equal(t, sa, sb, "step %s", name)
		require.Equal(t, shapesOf(two.events(idsA[name])), shapesOf(one.events(idsB[name])), "events of %s", name)
	}
	require.Equal(t, "in_progress", one.step(idsB["fresh"]).State)
	require.True(t, one.complete(idsB["fresh"], 1, `{}`, at), "the returned attempt fences complete_step")
	one.requireReady(idsB["child"], at)
}

func TestClaimAndStartStepsLimitAndArguments(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		limit   int
		worker  string
		leaseMs int64
		param   string // "" = no error
		want    int
	}{
		{"limit 0", 0, testWorker, testLeaseMs, "", 0},
		{"limit 2 of 3", 2, testWorker, testLeaseMs, "", 2},
		{"limit 4 of 3", 4, testWorker, testLeaseMs, "", 3},
		{"negative limit", -1, testWorker, testLeaseMs, "p_limit", 0},
		{"zero lease", 1, testWorker, 0, "p_lease_ms", 0},
		{"empty worker", 1, "", testLeaseMs, "p_worker", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, _ := b.task(`{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"},
				{"name": "c", "handler": "h"}]}`)
			before := b.taskSnapshot(taskID)
			rows, err := b.db.Pool.Query(b.ctx, `SELECT step_id FROM stepready.claim_and_start_steps($1, $2, $3, $4)`,
				tc.limit, tc.worker, tc.leaseMs, testBase)
			if err == nil {
				var ids []int64
				ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
				if err == nil {
					require.Len(t, ids, tc.want)
				}
			}
			if tc.param != "" {
				requireSQLState(t, err, "22023", tc.param)
				require.Equal(t, before, b.taskSnapshot(taskID))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, b.intCall(`SELECT count(*) FROM stepready.steps WHERE state = 'in_progress'`))
			if tc.want == 0 {
				require.Equal(t, before, b.taskSnapshot(taskID), "limit 0 changes nothing")
			}
		})
	}
}

// TestClaimOrderFollowsTaskPriority: steps carry their task's priority (steps.task_priority) for the claim index;
// a change of the task's priority reaches its waiting steps at once and an in-flight step when it comes back.
func TestClaimOrderFollowsTaskPriority(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskA, a := b.task(`{"name": "A", "priority": 1, "steps": [{"name": "a1", "handler": "h"},
		{"name": "a2", "handler": "h"}]}`)
	taskB, bb := b.task(`{"name": "B", "priority": 2, "steps": [{"name": "b1", "handler": "h"}]}`)
	require.Equal(t, 1, b.intCall(`SELECT task_priority FROM stepready.steps WHERE id = $1`, a["a1"]))

	// a2 is in flight while A's priority rises above B's.
	attempt := b.run(a["a2"], at)
	b.exec(`UPDATE stepready.tasks SET priority = 9 WHERE id = $1`, taskA)
	require.Equal(t, 9, b.intCall(`SELECT task_priority FROM stepready.steps WHERE id = $1`, a["a1"]))
	require.Equal(t, 1, b.intCall(`SELECT task_priority FROM stepready.steps WHERE id = $1`, a["a2"]),
		"a step in flight is left alone")
	require.True(t, b.boolCall(`SELECT stepready.release_step($1, $2, $3)`, a["a2"], attempt, at))
	require.Equal(t, 9, b.intCall(`SELECT task_priority FROM stepready.steps WHERE id = $1`, a["a2"]),
		"a step back in a claimable state reads its task's priority")

	require.Equal(t, []int64{a["a1"], a["a2"], bb["b1"]}, b.claimIDs(at))
	_ = taskB
}

// TestClaimSkipsStepsWaitingInHigherPriorityGroups: a backoff that has not ended, in a group that sorts first,
// neither blocks nor precedes the due steps of later groups; once due it comes first again.
func TestClaimSkipsStepsWaitingInHigherPriorityGroups(t *testing.T) {
	t.Parallel()
	at := testBase
	cases := []struct {
		name  string
		delay time.Duration // of the high-priority step's backoff, relative to the claim
		first bool          // whether it is claimed, and first
	}{
		{"due 1us after as_of", tick, false},
		{"due exactly at as_of", 0, true},
		{"due 1us before as_of", -tick, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			_, hi := b.task(`{"name": "hi", "priority": 5, "steps": [{"name": "h", "handler": "h", "priority": 3},
				{"name": "h2", "handler": "h"}]}`)
			_, lo := b.task(`{"name": "lo", "priority": 0, "steps": [{"name": "l", "handler": "h"}]}`)
			b.exec(`UPDATE stepready.steps SET state = 'waiting_for_retry', attempts = 1, next_attempt_at = $2
				WHERE id = $1`, hi["h"], at.Add(tc.delay))
			b.exec(`UPDATE stepready.steps SET next_attempt_at = $2 WHERE id = $1`, hi["h2"], at.Add(time.Hour))
			want := []int64{lo["l"]}
			if tc.first {
				want = []int64{hi["h"], lo["l"]}
			}
			require.Equal(t, want, claimedIDs(b.claim(10, at)))
		})
	}
}

func TestStartStepsMixedBatch(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	_, ids := b.task(`{"name": "t", "context": {"k": 1}, "steps": [{"name": "go", "handler": "h", "input": {"n": 1}},
		{"name": "pending", "handler": "h"}, {"name": "running", "handler": "h"}]}`)
	pausedTask, paused := b.oneStep("")
	b.enqueue(ids["go"], at)
	b.enqueue(paused, at)
	b.exec(`SELECT stepready.pause_task($1)`, pausedTask)
	b.run(ids["running"], at)
	untouched := map[string]string{"pending": b.snapshot(ids["pending"]), "running": b.snapshot(ids["running"])}
	const missing = int64(1 << 40)

	got := b.startSteps([]int64{missing, ids["running"], paused, ids["pending"], ids["go"]}, at)

	require.Equal(t, 1, deref(got[ids["go"]].Attempt))
	require.Equal(t, `{"n": 1}`, deref(got[ids["go"]].Input))
	require.Equal(t, `{"k": 1}`, deref(got[ids["go"]].Context))
	s := b.step(ids["go"])
	require.Equal(t, "in_progress", s.State)
	require.Equal(t, 1, s.Attempts)
	requireTime(t, at, s.LastAttemptedAt, "last_attempted_at")
	requireTime(t, at.Add(testLease), s.LeaseExpiresAt, "lease_expires_at")
	ev := b.lastEvents(ids["go"], 1)[0]
	require.Equal(t, "attempt.started", ev.Event)
	require.Equal(t, 1, deref(ev.Attempt))
	require.Equal(t, testWorker, ev.Details["worker"])

	for _, id := range []int64{missing, ids["running"], paused, ids["pending"]} {
		require.Nil(t, got[id].Attempt, "step %d must not run", id)
		require.Nil(t, got[id].Context, "step %d", id)
	}
	require.Equal(t, untouched["pending"], b.snapshot(ids["pending"]), "a pending step is not started")
	require.Equal(t, untouched["running"], b.snapshot(ids["running"]), "a running step is not started again")

	// The step of the paused task went back to its ready state, uncharged, with the reason.
	p := b.step(paused)
	require.Equal(t, "pending", p.State)
	require.Equal(t, 0, p.Attempts)
	ev = b.lastEvents(paused, 1)[0]
	require.Equal(t, "step.released", ev.Event)
	require.Equal(t, "task_paused", ev.Details["reason"])
}

func TestBatchFunctionsRejectBadArguments(t *testing.T) {
	t.Parallel()
	one := func(id int64) []any { return []any{id} }
	cases := []struct {
		name  string
		sql   string
		args  func(id int64) []any
		param string
	}{
		{"start: repeated id", `SELECT * FROM stepready.start_steps($1, 'w', 1000)`,
			func(id int64) []any { return []any{[]int64{id, id}} }, "contains step"},
		{"start: NULL id", `SELECT * FROM stepready.start_steps($1, 'w', 1000)`,
			func(id int64) []any { return []any{[]*int64{&id, nil}} }, "contains NULL at position 2"},
		{"start: NULL array", `SELECT * FROM stepready.start_steps(NULL, 'w', 1000)`,
			func(int64) []any { return nil }, "p_step_ids must not be NULL"},
		{"start: empty worker", `SELECT * FROM stepready.start_steps($1, '', 1000)`,
			func(id int64) []any { return []any{[]int64{id}} }, "p_worker"},
		{"complete: repeated id", `SELECT * FROM stepready.complete_steps($1, '{1,1}', '{"{}","{}"}')`,
			func(id int64) []any { return []any{[]int64{id, id}} }, "contains step"},
		{"complete: fewer attempts", `SELECT * FROM stepready.complete_steps($1, '{1}', '{"{}","{}"}')`,
			func(id int64) []any { return []any{[]int64{id, id + 1}} }, "p_attempts must have one entry per step id (2), got 1"},
		{"complete: more outputs", `SELECT * FROM stepready.complete_steps($1, '{1}', '{"{}","{}"}')`,
			func(id int64) []any { return []any{[]int64{id}} }, "p_outputs must have one entry per step id (1), got 2"},
		{"complete: NULL attempts", `SELECT * FROM stepready.complete_steps($1, NULL, '{"{}"}')`,
			func(id int64) []any { return []any{[]int64{id}} }, "p_attempts"},
		{"fail: repeated id", `SELECT * FROM stepready.fail_steps(ARRAY[$1::bigint, $1], '{1,1}', '{"{}","{}"}')`,
			one, "contains step"},
		{"fail: fewer attempts", `SELECT * FROM stepready.fail_steps(ARRAY[$1::bigint], '{}', '{"{}"}')`,
			one, "p_attempts must have one entry per step id (1), got 0"},
		{"fail: fewer errors", `SELECT * FROM stepready.fail_steps(ARRAY[$1::bigint], '{1}', '{}')`,
			one, "p_errors must have one entry per step id (1), got 0"},
		{"fail: samples of another length", `SELECT * FROM stepready.fail_steps(ARRAY[$1::bigint], '{1}', '{"{}"}', now(), '{0,0}')`,
			one, "p_jitter_samples must be NULL or have one entry per step id (1), got 2"},
		{"fail: sample out of range", `SELECT * FROM stepready.fail_steps(ARRAY[$1::bigint], '{1}', '{"{}"}', now(), '{1}')`,
			one, "p_jitter_samples[1] must be in [0, 1), got 1"},
		{"fail: bad error document", `SELECT * FROM stepready.fail_steps(ARRAY[$1::bigint], '{1}', '{"[]"}')`,
			one, "p_error must be a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, id := b.oneStep("")
			b.run(id, testBase)
			before := b.taskSnapshot(taskID)
			_, err := b.db.Pool.Exec(b.ctx, tc.sql, tc.args(id)...)
			requireSQLState(t, err, "22023", tc.param)
			require.Equal(t, before, b.taskSnapshot(taskID), "nothing changed")
		})
	}
}

func TestCompleteStepsFencesEachEntry(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := testBase
	taskID, ids := b.task(`{"name": "t", "steps": [{"name": "ok", "handler": "h"}, {"name": "stale", "handler": "h"},
		{"name": "queued", "handler": "h"}, {"name": "done", "handler": "h"}, {"name": "waiting", "handler": "h"}]}`)
	b.run(ids["ok"], at)
	b.run(ids["stale"], at) // attempt 1 is running; the batch says 2
	b.enqueue(ids["queued"], at)
	b.runToComplete(ids["done"], `{"first": true}`, at)
	b.retryOnce(ids["waiting"], `{"class": "transient"}`, at)
	const missing = int64(1 << 40)
	before := map[string]string{}
	for _, n := range []string{"stale", "queued", "done", "waiting"} {
		before[n] = b.snapshot(ids[n])
	}

	got, err := b.completeSteps(
		[]int64{ids["stale"], missing, ids["ok"], ids["queued"], ids["done"], ids["waiting"]},
		[]int{2, 1, 1, 0, 1, 1},
		[]string{`{}`, `{}`, `{"v": 42}`, `{}`, `{}`, `{}`}, at.Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, map[int64]bool{ids["stale"]: false, missing: false, ids["ok"]: true, ids["queued"]: false,
		ids["done"]: false, ids["waiting"]: false}, got)
	for n, snap := range before {
		require.Equal(t, snap, b.snapshot(ids[n]), "fenced entry %s changed nothing", n)
	}
	s := b.step(ids["ok"])
	require.Equal(t, "complete", s.State)
	require.JSONEq(t, `{"v": 42}`, deref(s.Output))
	requireTime(t, at.Add(time.Second), s.CompletedAt, "completed_at")
	require.Nil(t, s.LeaseOwner)
	evs := b.lastEvents(ids["ok"], 2)
	require.Equal(t, []string{"attempt.succeeded", "step.completed"}, eventNames(evs))
	for _, e := range evs {
		require.Equal(t, 1, deref(e.Attempt))
		require.True(t, at.Add(time.Second).Equal(e.At))
	}
	b.requireStatus(taskID, "in_progress")
}

// TestCompleteStepsAcrossTasks completes parents of several tasks in one call: counters and status of each task,
// children of each parent (a join counts both parents of one batch), one notification per task whose steps became
// ready, and the collect mode of each step.
func TestCompleteStepsAcrossTasks(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	at := pastTime // notifications compare next_attempt_at with the real clock
	diamond, d := b.task(`{"name": "diamond", "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"},
		{"name": "join", "handler": "h", "depends_on": ["a", "b"]}]}`)
	single, s := b.task(`{"name": "single", "steps": [{"name": "only", "handler": "h", "collect": "append"}]}`)
	chain, c := b.task(`{"name": "chain", "steps": [{"name": "first", "handler": "h"},
		{"name": "second", "handler": "h", "depends_on": ["first"]}]}`)
	half, h := b.task(`{"name": "half", "steps": [{"name": "x", "handler": "h"}, {"name": "y", "handler": "h"},
		{"name": "after", "handler": "h", "depends_on": ["x", "y"]}]}`)
	for _, id := range []int64{d["a"], d["b"], s["only"], c["first"], h["x"], h["y"]} {
		b.run(id, at)
	}
	l := b.listen()
	l.drain()
	wakes := b.wakeCount()

	got, err := b.completeSteps([]int64{c["first"], d["b"], s["only"], d["a"], h["x"]}, []int{1, 1, 1, 1, 1},
		[]string{`1`, `2`, `3`, `4`, `5`}, at)
	require.NoError(t, err)
	for id, ok := range got {
		require.True(t, ok, "step %d", id)
	}

	b.requireStatus(single, "complete")
	require.JSONEq(t, `[3]`, deref(b.step(s["only"]).Output), "collect append")
	b.requireStatus(diamond, "in_progress")
	b.requireStatus(chain, "in_progress")
	b.requireStatus(half, "in_progress")
	require.Equal(t, 0, b.step(d["join"]).PendingParents, "both parents completed in one call")
	require.Equal(t, 0, b.step(c["second"]).PendingParents)
	require.Equal(t, 1, b.step(h["after"]).PendingParents, "y is still running")
	b.requireReady(d["join"], at)
	b.requireNotReady(h["after"], at, "waiting_for_dependencies")

	// Steps became ready (join, second): one increment of the wake-up counter for the statement, and no
	// notification from the writing transaction (sql/045_notify.sql).
	require.Equal(t, wakes+1, b.wakeCount())
	l.requireNone()

	// The counters still match the rows.
	var mismatched int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `
		SELECT count(*) FROM stepready.tasks t
		 WHERE t.steps_total <> (SELECT count(*) FROM stepready.steps s WHERE s.task_id = t.id)
		    OR t.steps_unsatisfied <> (SELECT count(*) FROM stepready.steps s WHERE s.task_id = t.id
		                                 AND s.state NOT IN ('complete', 'resolved_manually', 'skipped'))`).Scan(&mismatched))
	require.Zero(t, mismatched)
}

// TestCompleteStepsCollectErrorChangesNothing: a collect = merge step given a non-object output fails the whole
// statement (the caller then records the entries one by one).
func TestCompleteStepsCollectErrorChangesNothing(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.task(`{"name": "t", "steps": [{"name": "m", "handler": "h", "collect": "merge"},
		{"name": "ok", "handler": "h"}]}`)
	b.run(ids["m"], testBase)
	b.run(ids["ok"], testBase)
	before := b.taskSnapshot(taskID)
	_, err := b.completeSteps([]int64{ids["ok"], ids["m"]}, []int{1, 1}, []string{`{}`, `[1]`}, testBase)
	requireSQLState(t, err, "22023", "collect = merge")
	require.Equal(t, before, b.taskSnapshot(taskID))
}

// TestConcurrentBatchesOverlappingSteps: two complete_steps calls racing over the same steps in opposite orders
// (a stale worker and the current one) neither deadlock nor complete a step twice.
func TestConcurrentBatchesOverlappingSteps(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, ids := b.task(`{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h"},
		{"name": "c", "handler": "h"}]}`)
	for _, n := range []string{"a", "b", "c"} {
		b.run(ids[n], testBase)
	}
	orders := [][]int64{{ids["a"], ids["b"], ids["c"]}, {ids["c"], ids["b"], ids["a"]}}
	completed := make([]int, 2)
	err := runParallel(b.ctx, b.db.Pool, 2, func(i int, conn *pgxpool.Conn) error {
		rows, err := conn.Query(b.ctx, `SELECT completed FROM stepready.complete_steps($1, '{1,1,1}', '{"{}","{}","{}"}')`,
			orders[i])
		if err != nil {
			return err
		}
		oks, err := pgx.CollectRows(rows, pgx.RowTo[bool])
		for _, ok := range oks {
			if ok {
				completed[i]++
			}
		}
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 3, completed[0]+completed[1], "each step completed exactly once")
	require.Equal(t, 3, b.intCall(`SELECT count(*) FROM stepready.step_events WHERE event = 'step.completed'`))
}

// TestEventsGoWithTheirTaskOrStep: step_events has no foreign keys; statement triggers delete the events of
// deleted tasks and steps, and TRUNCATE takes them along.
func TestEventsGoWithTheirTaskOrStep(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		do   string // $1: the task, $2: its step s
		left int    // events of the task left afterwards
	}{
		{"task deleted", `DELETE FROM stepready.tasks WHERE id = $1 AND $2::bigint IS NOT NULL`, 0},
		// the task-level pause event stays
		{"step deleted", `DELETE FROM stepready.steps WHERE id = $2 AND $1::bigint IS NOT NULL`, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := lifecycleSetup(t)
			taskID, ids := b.task(`{"name": "t", "steps": [{"name": "s", "handler": "h"}, {"name": "s2", "handler": "h"}]}`)
			otherTask, other := b.oneStep("")
			b.runToComplete(ids["s"], `{}`, testBase)
			b.runToComplete(other, `{}`, testBase)
			b.exec(`SELECT stepready.pause_task($1)`, taskID)
			otherEvents := b.intCall(`SELECT count(*) FROM stepready.step_events WHERE task_id = $1`, otherTask)
			require.Positive(t, otherEvents)

			b.exec(tc.do, taskID, ids["s"])
			require.Equal(t, tc.left, b.intCall(`SELECT count(*) FROM stepready.step_events WHERE task_id = $1`, taskID))
			require.Equal(t, otherEvents,
				b.intCall(`SELECT count(*) FROM stepready.step_events WHERE task_id = $1`, otherTask))
		})
	}
	t.Run("truncate", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		_, id := b.oneStep("")
		b.runToComplete(id, `{}`, testBase)
		require.Positive(t, b.intCall(`SELECT count(*) FROM stepready.step_events`))
		b.exec(`TRUNCATE stepready.tasks CASCADE`)
		require.Zero(t, b.intCall(`SELECT count(*) FROM stepready.step_events`))
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestFailStepsDecidesEachEntryAsFailStep runs one failure per step through fail_steps in a single call and the
// same failures one by one through fail_step on an identical fixture: every step, every event and every task
// must come out the same (the decision itself is pinned by TestFailStepDecision, through fail_step).
func TestFailStepsDecidesEachEntryAsFailStep(t *testing.T) {
	t.Parallel()
	at := testBase
	def := `{"name": "t", "steps": [
		{"name": "retry", "handler": "h", "retry": {"backoff": "linear", "base_delay_ms": 100, "jitter": 0.5}},
		{"name": "after", "handler": "h", "retry": {"max_attempts": 5}},
		{"name": "perm", "handler": "h", "on_exhausted": "skip"},
		{"name": "cascade", "handler": "h", "on_exhausted": "skip_cascade"},
		{"name": "below", "handler": "h", "depends_on": ["cascade"]},
		{"name": "breaker", "handler": "h", "breaker_limit": 1},
		{"name": "exhaust", "handler": "h", "retry": {"max_attempts": 1}},
		{"name": "stale", "handler": "h"}]}`
	type entry struct {
		name, err string
		attempt   int
		sample    float64
	}
	entries := []entry{
		{"retry", `{"class": "transient", "message": "reset"}`, 1, 0.25},
		{"after", `{"class": "rate_limited", "retry_after_ms": 1500}`, 1, 0},
		{"perm", `{"class": "permanent", "message": "no"}`, 1, 0},
		{"cascade", `{"message": "x", "retryable": false}`, 1, 0},
		{"breaker", `{"class": "deterministic", "message": "bad key 42"}`, 1, 0},
		{"exhaust", `{"class": "timeout", "retry": {"max_attempts": 2}}`, 1, 0.9},
		{"stale", `{"class": "transient"}`, 7, 0},
	}
	prepare := func(b *lifecycleBundle) (int64, map[string]int64) {
		taskID, ids := b.task(def)
		for _, e := range entries {
			b.run(ids[e.name], at)
		}
		return taskID, ids
	}

	one := lifecycleSetup(t)
	taskA, idsA := prepare(one)
	single := map[string]failResult{}
	for _, e := range entries {
		single[e.name] = one.fail(idsA[e.name], e.attempt, e.err, at, e.sample)
	}

	batch := lifecycleSetup(t)
	taskB, idsB := prepare(batch)
	ids := make([]int64, len(entries))
	attempts := make([]int, len(entries))
	errs := make([]string, len(entries))
	samples := make([]float64, len(entries))
	for i, e := range entries {
		ids[i], attempts[i], errs[i], samples[i] = idsB[e.name], e.attempt, e.err, e.sample
	}
	rows, err := batch.db.Pool.Query(batch.ctx, `SELECT step_id, state, next_attempt_at, reason
		FROM stepready.fail_steps($1, $2, $3::jsonb[], $4, $5)`, ids, attempts, errs, at, samples)
	require.NoError(t, err)
	got := map[int64]failResult{}
	var id int64
	var r failResult
	_, err = pgx.ForEachRow(rows, []any{&id, &r.State, &r.NextAttemptAt, &r.Reason}, func() error {
		got[id] = r
		return nil
	})
	require.NoError(t, err)
	require.Len(t, got, len(entries))

	require.Equal(t, "stale_attempt", deref(single["stale"].Reason))
	require.Equal(t, "skipped", deref(single["cascade"].State))
	require.Equal(t, "waiting_for_retry", deref(single["exhaust"].State), "the override grants the retry")
	for _, e := range entries {
		require.Equal(t, single[e.name], got[idsB[e.name]], "result of %s", e.name)
	}
	for _, name := range []string{"retry", "after", "perm", "cascade", "below", "breaker", "exhaust", "stale"} {
		sa, sb := one.step(idsA[name]), batch.step(idsB[name])
		sa.ID, sa.TaskID, sb.ID, sb.TaskID = 0, 0, 0, 0
		require.Equal(t, sa, sb, "step %s", name)
		require.Equal(t, shapesOf(one.events(idsA[name])), shapesOf(batch.events(idsB[name])), "events of %s", name)
	}
	require.Equal(t, one.taskRow(taskA).Status, batch.taskRow(taskB).Status)
	require.Equal(t, "skipped", batch.step(idsB["below"]).State, "skip_cascade reached the descendant")
}
