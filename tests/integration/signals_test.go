package integration

// Issue 22, SPEC §20: wait steps (signals and durable sleeps), the mailbox, send_signal and send_signal_to_key,
// and the exactly-once matching of a signal with the step that waits for it, whichever side comes first.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// signalRow is one row of stepready.signals.
type signalRow struct {
	ID             int64
	TaskID         int64
	Name           string
	Payload        string
	IdempotencyKey *string
	ConsumedBy     *int64
	ConsumedAt     *time.Time
}

// send calls send_signal at asOf and returns the id or the error.
func (b *lifecycleBundle) send(q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, taskID int64, name, payload string, key *string, asOf time.Time) (int64, error) {
	var id int64
	err := q.QueryRow(b.ctx, `SELECT stepready.send_signal($1, $2, $3::jsonb, $4, $5)`, taskID, name, payload, key,
		asOf).Scan(&id)
	return id, err
}

// mustSend sends and requires success.
func (b *lifecycleBundle) mustSend(taskID int64, name, payload string, asOf time.Time) int64 {
	b.t.Helper()
	id, err := b.send(b.db.Pool, taskID, name, payload, nil, asOf)
	require.NoError(b.t, err)
	return id
}

// signals lists a task's signals in id order.
func (b *lifecycleBundle) signals(taskID int64) []signalRow {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT id, task_id, name, payload::text, idempotency_key, consumed_by,
		consumed_at FROM stepready.signals WHERE task_id = $1 ORDER BY id`, taskID)
	require.NoError(b.t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[signalRow])
	require.NoError(b.t, err)
	return got
}

// approvalTask creates charge → approve (waits for signal "approval") → ship, runs nothing, and returns the ids.
func (b *lifecycleBundle) approvalTask(wait string) (int64, map[string]int64) {
	b.t.Helper()
	return b.task(`{"name": "refund", "steps": [
		{"name": "charge", "handler": "h"},
		{"name": "approve", "wait": ` + wait + `, "depends_on": ["charge"]},
		{"name": "ship", "handler": "h", "depends_on": ["approve"], "input": {"who": "${deps.approve.by}"}}]}`)
}

func TestWaitStepStartsWaitingWhenItsParentCompletes(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.approvalTask(`{"signal": "approval", "timeout_ms": 60000}`)
	b.requireState(ids["approve"], "pending")
	var handler string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT handler FROM stepready.steps WHERE id = $1`,
		ids["approve"]).Scan(&handler))
	require.Equal(t, "wait", handler)

	b.runToComplete(ids["charge"], `{}`, testBase)
	s := b.step(ids["approve"])
	require.Equal(t, "waiting", s.State)
	require.Equal(t, 1, s.Attempts)
	var until time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT wait_until FROM stepready.steps WHERE id = $1`,
		ids["approve"]).Scan(&until))
	require.True(t, until.Equal(testBase.Add(time.Minute)), "deadline from the parent's completion: %s", until)
	b.requireStatus(taskID, "in_progress")

	// Never claimable: no claim takes it, whatever the time.
	require.Empty(t, b.claim(10, testBase.Add(30*time.Second)))
	_, reason := b.readiness(ids["approve"], testBase)
	require.Equal(t, "waiting_for_signal", *reason)
	var status string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT execution_status FROM stepready.task_execution_context($1, $2)`, taskID, testBase).Scan(&status))
	require.Equal(t, "waiting", status)
	var msg string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT message FROM stepready.explain_step($1, $2) LIMIT 1`,
		ids["approve"], testBase).Scan(&msg))
	require.Contains(t, msg, `waiting for signal "approval" until 00:01:00 (in 1m00s), then fails (timeout)`)

	// Delivered now: the step completes with the payload, ship is claimable with it in deps.
	id := b.mustSend(taskID, "approval", `{"by": "ann"}`, testBase.Add(time.Second))
	s = b.step(ids["approve"])
	require.Equal(t, "complete", s.State)
	require.JSONEq(t, `{"by": "ann"}`, *s.Output)
	sigs := b.signals(taskID)
	require.Len(t, sigs, 1)
	require.Equal(t, id, sigs[0].ID)
	require.Equal(t, ids["approve"], *sigs[0].ConsumedBy)
	rows := b.mapClaimStart(10, testBase.Add(time.Second))
	require.Len(t, rows, 1)
	require.Equal(t, ids["ship"], rows[0].StepID)
	require.JSONEq(t, `{"who": "ann"}`, rows[0].Input)
	require.Equal(t, []string{"wait.started", "signal.delivered", "step.completed"}, eventNames(b.events(ids["approve"])))
}

func TestSignalSentBeforeTheWaitIsBufferedAndConsumedWhenItBegins(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.approvalTask(`{"signal": "approval"}`)
	first := b.mustSend(taskID, "approval", `{"by": "bob"}`, testBase)
	sigs := b.signals(taskID)
	require.Len(t, sigs, 1)
	require.Nil(t, sigs[0].ConsumedBy, "buffered")
	// A second one would never be read: one step waits for the name.
	_, err := b.send(b.db.Pool, taskID, "approval", `{}`, nil, testBase)
	require.Equal(t, "55000", sqlState(err), "%v", err)

	b.runToComplete(ids["charge"], `{}`, testBase.Add(time.Second))
	s := b.step(ids["approve"])
	require.Equal(t, "complete", s.State)
	require.JSONEq(t, `{"by": "bob"}`, *s.Output)
	sigs = b.signals(taskID)
	require.Equal(t, first, sigs[0].ID)
	require.Equal(t, ids["approve"], *sigs[0].ConsumedBy)
	require.True(t, sigs[0].ConsumedAt.Equal(testBase.Add(time.Second)))
}

// defErr is the error create_task raises for definition, or nil.
func (b *lifecycleBundle) defErr(definition string) error {
	var id int64
	return b.db.Pool.QueryRow(b.ctx, `SELECT stepready.create_task($1::jsonb)`, definition).Scan(&id)
}

func TestWaitDefinitionErrors(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	def := func(step string) string {
		return `{"name": "t", "steps": [{"name": "a", "handler": "h"}, ` + step + `]}`
	}
	for _, tc := range []struct{ step, want string }{
		{`{"name": "w", "handler": "h", "wait": {"signal": "x"}}`,
			`steps[1] "w": handler and wait: a step has one or the other, not both`},
		{`{"name": "w", "wait": {"signal": "x"}, "map": {"over": [1]}}`, `steps[1] "w": map and wait`},
		{`{"name": "w", "wait": {"signal": "x"}, "rules": []}`, `steps[1] "w": rules and wait`},
		{`{"name": "w", "wait": "x"}`, `steps[1] "w": wait: must be an object`},
		{`{"name": "w", "wait": {}}`, `steps[1] "w": wait: must have exactly one of signal, duration_ms and until`},
		{`{"name": "w", "wait": {"signal": "x", "duration_ms": 5}}`, `steps[1] "w": wait: must have exactly one of`},
		{`{"name": "w", "wait": {"signal": "x", "after": 5}}`, `steps[1] "w": wait: unknown field "after"`},
		{`{"name": "w", "wait": {"signal": ""}}`, `steps[1] "w": wait.signal: must be a non-empty string, got ""`},
		{`{"name": "w", "wait": {"signal": 7}}`, `steps[1] "w": wait.signal: must be a non-empty string, got 7`},
		{`{"name": "w", "wait": {"signal": "x", "timeout_ms": -1}}`,
			`steps[1] "w": wait.timeout_ms: must be an integer >= 0, got -1`},
		{`{"name": "w", "wait": {"signal": "x", "timeout_ms": 1.5}}`, `steps[1] "w": wait.timeout_ms: must be an integer`},
		{`{"name": "w", "wait": {"signal": "x", "timeout_ms": "5s"}}`, `steps[1] "w": wait.timeout_ms: must be an integer`},
		{`{"name": "w", "wait": {"signal": "x", "on_timeout": "retry"}}`,
			`steps[1] "w": wait.on_timeout: must be fail or continue, got "retry"`},
		{`{"name": "w", "wait": {"duration_ms": -5}}`, `steps[1] "w": wait.duration_ms: must be an integer >= 0, got -5`},
		{`{"name": "w", "wait": {"duration_ms": null}}`, `steps[1] "w": wait.duration_ms: must be an integer >= 0, got null`},
		{`{"name": "w", "wait": {"duration_ms": 5, "timeout_ms": 5}}`,
			`steps[1] "w": wait: timeout_ms goes with signal only`},
		{`{"name": "w", "wait": {"until": "tomorrow"}}`, `steps[1] "w": wait.until: must be an RFC 3339 time`},
		{`{"name": "w", "wait": {"until": "2030-01-01 00:00:00"}}`, `steps[1] "w": wait.until: must be an RFC 3339 time`},
		{`{"name": "w", "wait": {"until": "2030-02-30T00:00:00Z"}}`, `steps[1] "w": wait.until: must be an RFC 3339 time`},
		{`{"name": "w", "wait": {"until": 1893456000}}`, `steps[1] "w": wait.until: must be an RFC 3339 time or a reference, got 1893456000`},
		{`{"name": "w", "wait": {"until": "${deps.a.at}"}}`,
			`steps[1] "w": wait.until: reference ${deps.a.at} names step "a", which is not a direct parent (depends_on)`},
		{`{"name": "w", "wait": {"until": "at ${context.at}"}}`, `steps[1] "w": wait.until: must be an RFC 3339 time or exactly one reference`},
		{`{"name": "w", "wait": {"until": "${task.id}"}}`, `steps[1] "w": wait.until: must be an RFC 3339 time or exactly one reference`},
		{`{"name": "w", "wait": {"until": "${context.at"}}`, `steps[1] "w": wait.until: reference ${context.at is not closed`},
	} {
		err := b.defErr(def(tc.step))
		require.Error(t, err, tc.step)
		require.Equal(t, "22023", sqlState(err), "%s: %v", tc.step, err)
		require.Contains(t, err.Error(), tc.want, tc.step)
	}
	// create_tasks names the element; nothing of the call is written.
	var n int
	err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.create_tasks($1::jsonb)`,
		`[`+def(`{"name": "w", "wait": {"signal": "x"}}`)+`, `+def(`{"name": "w", "wait": {"duration_ms": -1}}`)+`]`).Scan(&n)
	require.Error(t, err)
	require.Contains(t, err.Error(), `definitions[1]: steps[1] "w": wait.duration_ms: must be an integer >= 0`)
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&n))
	require.Zero(t, n)
	// Templates are checked by the same validation.
	_, err = b.db.Pool.Exec(b.ctx, `INSERT INTO stepready.task_templates (name, definition) VALUES ('tw', $1::jsonb)`,
		def(`{"name": "w", "wait": {"signal": "x", "on_timeout": "never"}}`))
	require.Error(t, err)
	require.Contains(t, err.Error(), `steps[1] "w": wait.on_timeout: must be fail or continue`)
	// Valid ones pass, on every path.
	for _, w := range []string{`{"signal": "x"}`, `{"signal": "x", "timeout_ms": 0, "on_timeout": "continue"}`,
		`{"duration_ms": 0}`, `{"until": "2030-01-01T00:00:00.5+02:00"}`, `{"until": "${context.at}"}`} {
		require.NoError(t, b.defErr(def(`{"name": "w", "depends_on": ["a"], "wait": `+w+`}`)), w)
	}
	require.NoError(t, b.defErr(def(`{"name": "w", "depends_on": ["a"], "wait": {"until": "${deps.a.at}"}}`)))
}

func TestWaitPlainSQLInsert(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	var taskID int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `INSERT INTO stepready.tasks (name) VALUES ('plain') RETURNING id`).
		Scan(&taskID))
	// Both: refused, naming the step.
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO stepready.steps (task_id, name, handler, wait)
		VALUES ($1, 'w', 'h', '{"signal": "x"}')`, taskID)
	require.Equal(t, "22023", sqlState(err))
	require.Contains(t, err.Error(), `step "w" of task`)
	require.Contains(t, err.Error(), "handler and wait")
	_, err = b.db.Pool.Exec(b.ctx, `INSERT INTO stepready.steps (task_id, name, wait)
		VALUES ($1, 'w', '{"signal": "x", "timeout_ms": -3}')`, taskID)
	require.Equal(t, "22023", sqlState(err))
	require.Contains(t, err.Error(), `step "w" of task`)
	require.Contains(t, err.Error(), "wait.timeout_ms: must be an integer >= 0, got -3")

	// A wait step and a child, inserted in one transaction with their edge: the wait begins at commit.
	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	var w, c int64
	require.NoError(t, tx.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, wait)
		VALUES ($1, 'w', '{"signal": "go"}') RETURNING id`, taskID).Scan(&w))
	require.NoError(t, tx.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, handler)
		VALUES ($1, 'c', 'h') RETURNING id`, taskID).Scan(&c))
	_, err = tx.Exec(b.ctx, `INSERT INTO stepready.step_edges (parent_step_id, child_step_id) VALUES ($1, $2)`, w, c)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.ctx))
	b.requireState(w, "waiting")
	b.requireState(c, "pending")
	b.mustSend(taskID, "go", `"yes"`, testBase)
	b.requireState(w, "complete")
	require.Equal(t, []int64{c}, b.claimIDs(testBase))
}

// waitTask creates a task whose only step is a wait (no parent: it waits from creation) and returns its ids.
func (b *lifecycleBundle) waitTask(wait string, extra string) (int64, int64) {
	b.t.Helper()
	taskID, ids := b.task(`{"name": "w", "steps": [{"name": "w", "wait": ` + wait + extra + `},
		{"name": "after", "handler": "h", "depends_on": ["w"]}]}`)
	return taskID, ids["w"]
}

// waitUntil reads a step's wait_until.
func (b *lifecycleBundle) waitUntil(stepID int64) *time.Time {
	b.t.Helper()
	var at *time.Time
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT wait_until FROM stepready.steps WHERE id = $1`, stepID).
		Scan(&at))
	return at
}

// nextClaimAt calls next_claim_at(asOf).
func (b *lifecycleBundle) nextClaimAt(asOf time.Time) *time.Time {
	b.t.Helper()
	var at *time.Time
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.next_claim_at($1)`, asOf).Scan(&at))
	return at
}

func TestSleepEndsAtItsTimeExactly(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, ids := b.approvalTask(`{"duration_ms": 1500}`)
	b.runToComplete(ids["charge"], `{}`, testBase)
	end := testBase.Add(1500 * time.Millisecond)
	require.True(t, b.waitUntil(ids["approve"]).Equal(end))
	require.True(t, b.nextClaimAt(testBase).Equal(end), "the daemon's timer wakes at the end of the sleep")
	_, reason := b.readiness(ids["approve"], testBase)
	require.Equal(t, "sleeping", *reason)

	require.Empty(t, b.claim(10, end.Add(-tick)))
	b.requireState(ids["approve"], "waiting")
	// At its end: the claim's own round trip ends the sleep and takes the dependent step at once.
	require.Equal(t, []int64{ids["ship"]}, b.claimIDs(end))
	s := b.step(ids["approve"])
	require.Equal(t, "complete", s.State)
	require.JSONEq(t, `{"slept_until": "2030-01-01T00:00:01.5+00:00"}`, *s.Output)
	require.True(t, s.CompletedAt.Equal(end))
}

func TestUntilInThePastEndsAtTheNextClaim(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, w := b.waitTask(`{"until": "2020-01-01T00:00:00Z"}`, "")
	b.requireState(w, "waiting")
	require.Len(t, b.claim(10, testBase), 1)
	s := b.step(w)
	require.Equal(t, "complete", s.State)
	require.JSONEq(t, `{"slept_until": "2020-01-01T00:00:00+00:00"}`, *s.Output)
}

func TestUntilReference(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	for _, tc := range []struct {
		name, output, state, msg string
	}{
		{"resolves", `{"at": "2030-01-01T00:10:00Z"}`, "waiting", ""},
		{"missing", `{"other": 1}`, "error", "${deps.charge.at}"},
		{"not a time", `{"at": 42}`, "error", "is 42, not an RFC 3339 time"},
	} {
		taskID, ids := b.approvalTask(`{"until": "${deps.charge.at}"}`)
		b.runToComplete(ids["charge"], tc.output, testBase)
		s := b.step(ids["approve"])
		require.Equal(t, tc.state, s.State, tc.name)
		if tc.state == "waiting" {
			require.True(t, b.waitUntil(ids["approve"]).Equal(testBase.Add(10*time.Minute)), tc.name)
			continue
		}
		var le map[string]any
		require.NoError(t, json.Unmarshal([]byte(*s.LastError), &le))
		require.Equal(t, "deterministic", le["class"], tc.name)
		require.Contains(t, le["message"], tc.msg, tc.name)
		b.requireStatus(taskID, "error")
	}
	// ${context…}, resolved when the step starts waiting (here: at creation).
	taskID, w := b.waitTask(`{"until": "${context.remind_at}"}`, "")
	_ = taskID
	require.Equal(t, "error", b.step(w).State, "the context has no remind_at")
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.create_task($1::jsonb)`, `{"name": "c",
		"context": {"remind_at": "2030-01-02T00:00:00Z"}, "steps": [{"name": "w", "wait": {"until": "${context.remind_at}"}}]}`).
		Scan(&id))
	sid := b.stepIDs(id)["w"]
	b.requireState(sid, "waiting")
	require.True(t, b.waitUntil(sid).Equal(testBase.Add(24*time.Hour)))
}

func TestSignalTimeoutBoundaries(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	for _, tc := range []struct {
		wait, onExhausted, state, status string
		output                           *string
	}{
		{`{"signal": "s", "timeout_ms": 1000}`, "fail_task", "error", "error", nil},
		{`{"signal": "s", "timeout_ms": 1000, "on_timeout": "fail"}`, "skip", "skipped", "complete", nil},
		{`{"signal": "s", "timeout_ms": 1000, "on_timeout": "continue"}`, "fail_task", "complete", "complete",
			ptr("null")},
	} {
		taskID, ids := b.approvalTask(tc.wait)
		b.exec(`UPDATE stepready.steps SET on_exhausted = $2 WHERE id = $1`, ids["approve"], tc.onExhausted)
		b.runToComplete(ids["charge"], `{}`, testBase)
		deadline := testBase.Add(time.Second)
		b.claim(10, deadline.Add(-tick))
		b.requireState(ids["approve"], "waiting")
		b.claim(10, deadline)
		s := b.step(ids["approve"])
		require.Equal(t, tc.state, s.State, tc.wait)
		require.True(t, s.CompletedAt.Equal(deadline), tc.wait)
		if tc.output != nil {
			require.NotNil(t, s.Output)
			require.JSONEq(t, *tc.output, *s.Output)
		} else {
			var le map[string]any
			require.NoError(t, json.Unmarshal([]byte(*s.LastError), &le))
			require.Equal(t, "timeout", le["class"])
			require.Equal(t, `no signal "s" within 1000 ms`, le["message"])
		}
		names := eventNames(b.events(ids["approve"]))
		require.Contains(t, names, "wait.timed_out", tc.wait)
		if tc.status == "error" {
			b.requireStatus(taskID, "error")
		} else {
			require.NotEqual(t, "error", b.taskRow(taskID).Status)
		}
		// Too late: refused, the step is finished.
		_, err := b.send(b.db.Pool, taskID, "s", `{}`, nil, deadline)
		require.Equal(t, "55000", sqlState(err), tc.wait)
	}
}

func TestSendSignalRefusals(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.approvalTask(`{"signal": "approval"}`)
	for _, tc := range []struct {
		task    int64
		name    string
		payload string
		state   string
		msg     string
	}{
		{taskID + 1000, "approval", `{}`, "P0002", fmt.Sprintf(`task %d does not exist`, taskID+1000)},
		{taskID, "nobody", `{}`, "55000", `no step of it that is not finished waits for "nobody"`},
		{taskID, "", `{}`, "22023", "p_name must be a non-empty signal name"},
		{taskID, strings.Repeat("n", 256), `{}`, "22023", "p_name must be at most 255 characters"},
	} {
		_, err := b.send(b.db.Pool, tc.task, tc.name, tc.payload, nil, testBase)
		require.Equal(t, tc.state, sqlState(err), "%v", err)
		require.Contains(t, err.Error(), tc.msg)
	}
	_, err := b.send(b.db.Pool, taskID, "approval", `{}`, ptr(""), testBase)
	require.Equal(t, "22023", sqlState(err))
	var id int64
	err = b.db.Pool.QueryRow(b.ctx, `SELECT stepready.send_signal_to_key('no-such-key', 'approval')`).Scan(&id)
	require.Equal(t, "P0002", sqlState(err))
	require.Contains(t, err.Error(), `no task has idempotency key "no-such-key"`)

	// A name only a finished step waited for.
	b.runToComplete(ids["charge"], `{}`, testBase)
	b.mustSend(taskID, "approval", `{"by": "cy"}`, testBase)
	_, err = b.send(b.db.Pool, taskID, "approval", `{}`, nil, testBase)
	require.Equal(t, "55000", sqlState(err))
	require.Contains(t, err.Error(), `no step of it that is not finished waits for "approval"`)
	// A finished task.
	b.runToComplete(ids["ship"], `{}`, testBase)
	b.requireStatus(taskID, "complete")
	_, err = b.send(b.db.Pool, taskID, "approval", `{}`, nil, testBase)
	require.Equal(t, "55000", sqlState(err))
	require.Contains(t, err.Error(), "the task is complete")
	// A cancelled task.
	other, _ := b.approvalTask(`{"signal": "approval"}`)
	b.exec(`SELECT stepready.cancel_task($1)`, other)
	_, err = b.send(b.db.Pool, other, "approval", `{}`, nil, testBase)
	require.Equal(t, "55000", sqlState(err))
	require.Contains(t, err.Error(), "the task is cancelled")
	require.Len(t, b.signals(other), 0, "nothing buffered")
}

func TestSendSignalToKeyAndIdempotency(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	var taskID int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.create_task($1::jsonb)`, `{"name": "k",
		"idempotency_key": "order-7", "steps": [{"name": "a", "wait": {"signal": "paid"}},
		{"name": "b", "wait": {"signal": "paid"}}]}`).Scan(&taskID))
	var first, again int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT stepready.send_signal_to_key('order-7', 'paid', '{"n": 1}', 'evt-1', $1)`, testBase).Scan(&first))
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT stepready.send_signal_to_key('order-7', 'paid', '{"n": 2}', 'evt-1', $1)`, testBase).Scan(&again))
	require.Equal(t, first, again, "a repeated key returns the first signal's id")
	sigs := b.signals(taskID)
	require.Len(t, sigs, 1)
	require.JSONEq(t, `{"n": 1}`, sigs[0].Payload)
	ids := b.stepIDs(taskID)
	b.requireState(ids["a"], "complete")
	b.requireState(ids["b"], "waiting")
	// The key is per task: another task may use it.
	other, _ := b.waitTask(`{"signal": "paid"}`, "")
	third, err := b.send(b.db.Pool, other, "paid", `{}`, ptr("evt-1"), testBase)
	require.NoError(t, err)
	require.NotEqual(t, first, third)

	// Concurrently: one signal, every caller gets its id.
	const n = 8
	got := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = b.send(b.db.Pool, taskID, "paid", `{"n": 3}`, ptr("evt-2"), testBase) })
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, got[0], got[i])
	}
	require.Len(t, b.signals(taskID), 2)
	b.requireState(ids["b"], "complete")
	// After the task finished, the key still answers with its id (a retried webhook), an unknown key is refused.
	b.requireStatus(taskID, "complete")
	id, err := b.send(b.db.Pool, taskID, "paid", `{}`, ptr("evt-2"), testBase)
	require.NoError(t, err)
	require.Equal(t, got[0], id)
	_, err = b.send(b.db.Pool, taskID, "paid", `{}`, ptr("evt-3"), testBase)
	require.Equal(t, "55000", sqlState(err))
}

func TestSignalPayloads(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	var maxBytes int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT value::text::int FROM stepready.settings WHERE name = 'max_output_bytes'`).Scan(&maxBytes))
	big := func(size int) string { // a JSON string whose text is exactly size bytes
		return `"` + strings.Repeat("x", size-2) + `"`
	}
	for _, payload := range []string{
		`{"quote": "she said \"yes\"", "backslash": "a\\b", "sql": "'; DROP TABLE x; --"}`,
		`{"unicode": "äöü ✓ 日本 🎉", "escaped": "\u00e9"}`,
		`null`, `[1, 2, 3]`, `"text"`,
		big(maxBytes),
	} {
		taskID, w := b.waitTask(`{"signal": "s"}`, "")
		b.mustSend(taskID, "s", payload, testBase)
		s := b.step(w)
		require.Equal(t, "complete", s.State)
		require.JSONEq(t, payload, *s.Output)
	}
	taskID, w := b.waitTask(`{"signal": "s"}`, "")
	_, err := b.send(b.db.Pool, taskID, "s", big(maxBytes+1), nil, testBase)
	require.Equal(t, "54000", sqlState(err))
	require.Contains(t, err.Error(), fmt.Sprintf("payload is %d bytes, over the limit of %d bytes", maxBytes+1, maxBytes))
	b.requireState(w, "waiting")
	require.Empty(t, b.signals(taskID))
	// SQL NULL is the empty object (the column's default).
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT stepready.send_signal($1, 's', NULL)`, taskID).Scan(&id))
	require.JSONEq(t, `{}`, *b.step(w).Output)
}

// waitForLock polls pg_stat_activity until a backend other than the test's waits on an advisory lock while
// running a statement that contains what, or fails at the deadline.
func (b *lifecycleBundle) waitForLock(what string) {
	b.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'
			  AND strpos(query, $1) > 0`, what).Scan(&n))
		if n > 0 {
			return
		}
		require.True(b.t, time.Now().Before(deadline), "nobody waited on the mailbox lock running %q", what)
		select {
		case <-b.ctx.Done():
			b.t.FailNow()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// requireDeliveredOnce checks that step got exactly one signal, the task's only one of that name, with payload.
func (b *lifecycleBundle) requireDeliveredOnce(taskID, stepID int64, payload string) {
	b.t.Helper()
	s := b.step(stepID)
	require.Equal(b.t, "complete", s.State)
	require.JSONEq(b.t, payload, *s.Output)
	sigs := b.signals(taskID)
	require.Len(b.t, sigs, 1)
	require.NotNil(b.t, sigs[0].ConsumedBy)
	require.Equal(b.t, stepID, *sigs[0].ConsumedBy)
	var completed int
	require.NoError(b.t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.step_events
		WHERE task_id = $1 AND step_id = $2 AND event = 'step.completed'`, taskID, stepID).Scan(&completed))
	require.Equal(b.t, 1, completed)
}

// The race matrix (RELIABILITY #14): the step's own transition to `waiting` and a sender in two concurrent
// transactions, each order held open on purpose at the lock, then released.
func TestSignalRacesTheTransitionToWaiting(t *testing.T) {
	t.Parallel()

	t.Run("transition holds the lock, then the sender", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.approvalTask(`{"signal": "approval"}`)
		attempt := b.run(ids["charge"], testBase)
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		var ok bool
		require.NoError(t, tx.QueryRow(b.ctx, `SELECT stepready.complete_step($1, $2, '{}', $3)`, ids["charge"],
			attempt, testBase).Scan(&ok))
		require.True(t, ok)
		done := make(chan error, 1)
		go func() {
			_, err := b.send(b.db.Pool, taskID, "approval", `{"by": "race-1"}`, nil, testBase)
			done <- err
		}()
		b.waitForLock("send_signal")
		require.NoError(t, tx.Commit(b.ctx))
		require.NoError(t, <-done)
		b.requireDeliveredOnce(taskID, ids["approve"], `{"by": "race-1"}`)
	})

	t.Run("sender holds the lock, then the transition", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.approvalTask(`{"signal": "approval"}`)
		attempt := b.run(ids["charge"], testBase)
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		_, err = b.send(tx, taskID, "approval", `{"by": "race-2"}`, nil, testBase)
		require.NoError(t, err)
		done := make(chan bool, 1)
		go func() { done <- b.complete(ids["charge"], attempt, `{}`, testBase) }()
		b.waitForLock("complete_step")
		require.NoError(t, tx.Commit(b.ctx))
		require.True(t, <-done)
		b.requireDeliveredOnce(taskID, ids["approve"], `{"by": "race-2"}`)
	})

	t.Run("sender rolls back", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.approvalTask(`{"signal": "approval"}`)
		attempt := b.run(ids["charge"], testBase)
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		_, err = b.send(tx, taskID, "approval", `{"by": "gone"}`, nil, testBase)
		require.NoError(t, err)
		done := make(chan bool, 1)
		go func() { done <- b.complete(ids["charge"], attempt, `{}`, testBase) }()
		b.waitForLock("complete_step")
		require.NoError(t, tx.Rollback(b.ctx))
		require.True(t, <-done)
		b.requireState(ids["approve"], "waiting")
		require.Empty(t, b.signals(taskID))
	})

	t.Run("timer and sender at the deadline", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.approvalTask(`{"signal": "approval", "timeout_ms": 1000}`)
		b.runToComplete(ids["charge"], `{}`, testBase)
		deadline := testBase.Add(time.Second)
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		_, err = b.send(tx, taskID, "approval", `{"by": "just in time"}`, nil, deadline.Add(-tick))
		require.NoError(t, err)
		// The claim at the deadline does not wait for the sender and does not time the step out under it.
		require.Empty(t, b.claim(10, deadline))
		require.NoError(t, tx.Commit(b.ctx))
		b.requireDeliveredOnce(taskID, ids["approve"], `{"by": "just in time"}`)
		require.NotContains(t, eventNames(b.events(ids["approve"])), "wait.timed_out")
	})
}

// manyWaiters creates a task with a root step and m wait steps for signal "go" after it.
func (b *lifecycleBundle) manyWaiters(m int) (int64, int64, []int64) {
	b.t.Helper()
	steps := []string{`{"name": "root", "handler": "h"}`}
	for i := range m {
		steps = append(steps, fmt.Sprintf(`{"name": "w%d", "wait": {"signal": "go"}, "depends_on": ["root"]}`, i))
	}
	taskID, ids := b.task(`{"name": "many", "steps": [` + strings.Join(steps, ", ") + `]}`)
	waiters := make([]int64, m)
	for i := range m {
		waiters[i] = ids[fmt.Sprintf("w%d", i)]
	}
	return taskID, ids["root"], waiters
}

// sendConcurrently sends n signals "go" at once (payload {"n": i}) and returns how many were accepted and the
// SQLSTATEs of the refusals.
func (b *lifecycleBundle) sendConcurrently(taskID int64, n int) (int, []string) {
	b.t.Helper()
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = b.send(b.db.Pool, taskID, "go", fmt.Sprintf(`{"n": %d}`, i), nil, testBase)
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	var refused []string
	for _, err := range errs {
		if err == nil {
			ok++
		} else {
			refused = append(refused, sqlState(err))
		}
	}
	return ok, refused
}

// requireEachGotOne checks that every waiter completed with its own signal: m signals, each consumed by exactly
// one waiter, each waiter's output its signal's payload.
func (b *lifecycleBundle) requireEachGotOne(taskID int64, waiters []int64) {
	b.t.Helper()
	sigs := b.signals(taskID)
	require.Len(b.t, sigs, len(waiters))
	byStep := map[int64]signalRow{}
	for _, g := range sigs {
		require.NotNil(b.t, g.ConsumedBy, "signal %d unconsumed", g.ID)
		_, dup := byStep[*g.ConsumedBy]
		require.False(b.t, dup, "step %d consumed two signals", *g.ConsumedBy)
		byStep[*g.ConsumedBy] = g
	}
	for _, w := range waiters {
		g, ok := byStep[w]
		require.True(b.t, ok, "step %d got no signal", w)
		s := b.step(w)
		require.Equal(b.t, "complete", s.State)
		require.JSONEq(b.t, g.Payload, *s.Output)
	}
}

func TestSeveralSendersAtOnce(t *testing.T) {
	t.Parallel()
	const m, n = 3, 8

	t.Run("steps waiting", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, root, waiters := b.manyWaiters(m)
		b.runToComplete(root, `{}`, testBase)
		for _, w := range waiters {
			b.requireState(w, "waiting")
		}
		ok, refused := b.sendConcurrently(taskID, n)
		require.Equal(t, m, ok)
		require.Len(t, refused, n-m)
		for _, st := range refused {
			require.Equal(t, "55000", st)
		}
		b.requireEachGotOne(taskID, waiters)
	})

	t.Run("steps not waiting yet", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, root, waiters := b.manyWaiters(m)
		ok, refused := b.sendConcurrently(taskID, n)
		require.Equal(t, m, ok, "buffered: one per step that will read one")
		require.Len(t, refused, n-m)
		b.runToComplete(root, `{}`, testBase)
		b.requireEachGotOne(taskID, waiters)
		// Oldest signal to the oldest step.
		sigs := b.signals(taskID)
		for i, g := range sigs {
			require.Equal(t, waiters[i], *g.ConsumedBy)
		}
	})
}

func TestOperatorsOnWaitingSteps(t *testing.T) {
	t.Parallel()

	t.Run("cancel_task ends a waiting step", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, w := b.waitTask(`{"signal": "s", "timeout_ms": 1000}`, "")
		b.requireState(w, "waiting")
		require.Equal(t, 2, b.intCall(`SELECT stepready.cancel_task($1, 'no longer needed', $2)`, taskID, testBase))
		b.requireState(w, "cancelled")
		// The timer finds nothing to end; a signal is refused.
		require.Nil(t, b.nextClaimAt(testBase))
		b.claim(10, testBase.Add(time.Hour))
		b.requireState(w, "cancelled")
		_, err := b.send(b.db.Pool, taskID, "s", `{}`, nil, testBase)
		require.Equal(t, "55000", sqlState(err))
	})

	t.Run("resolve_step completes it with the given output", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.approvalTask(`{"signal": "approval"}`)
		b.runToComplete(ids["charge"], `{}`, testBase)
		require.True(t, b.boolCall(`SELECT stepready.resolve_step($1, '{"by": "operator"}', $2)`, ids["approve"], testBase))
		s := b.step(ids["approve"])
		require.Equal(t, "resolved_manually", s.State)
		require.JSONEq(t, `{"by": "operator"}`, *s.Output)
		rows := b.mapClaimStart(10, testBase)
		require.Len(t, rows, 1)
		require.JSONEq(t, `{"who": "operator"}`, rows[0].Input)
		_, err := b.send(b.db.Pool, taskID, "approval", `{}`, nil, testBase)
		require.Equal(t, "55000", sqlState(err), "nobody waits any more")
	})

	t.Run("reset_task makes a failed wait wait afresh for a new signal", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.approvalTask(`{"signal": "approval", "timeout_ms": 1000}`)
		b.runToComplete(ids["charge"], `{}`, testBase)
		b.claim(10, testBase.Add(time.Second))
		b.requireState(ids["approve"], "error")
		b.requireStatus(taskID, "error")
		later := testBase.Add(time.Hour)
		require.Equal(t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, later))
		s := b.step(ids["approve"])
		require.Equal(t, "waiting", s.State)
		require.Equal(t, 1, s.Attempts)
		require.True(t, b.waitUntil(ids["approve"]).Equal(later.Add(time.Second)), "the timeout runs from the reset")
		b.requireStatus(taskID, "in_progress")
		b.mustSend(taskID, "approval", `{"by": "second"}`, later)
		b.requireDeliveredOnce(taskID, ids["approve"], `{"by": "second"}`)
	})

	t.Run("reset_task after a delivery: the consumed signal stays consumed", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.approvalTask(`{"signal": "approval"}`)
		b.runToComplete(ids["charge"], `{}`, testBase)
		first := b.mustSend(taskID, "approval", `{"by": "first"}`, testBase)
		// ship fails for good; the reset puts it back, not the completed wait.
		attempt := b.run(ids["ship"], testBase)
		b.fail(ids["ship"], attempt, `{"class": "permanent"}`, testBase, 0)
		b.requireStatus(taskID, "error")
		require.Equal(t, 1, b.intCall(`SELECT stepready.reset_task($1, $2)`, taskID, testBase))
		b.requireState(ids["approve"], "complete")
		sigs := b.signals(taskID)
		require.Len(t, sigs, 1)
		require.Equal(t, first, sigs[0].ID)
		require.Equal(t, ids["approve"], *sigs[0].ConsumedBy)
	})

	t.Run("retry_step_now on a timed out wait waits again", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, ids := b.approvalTask(`{"duration_ms": 0}`)
		b.exec(`UPDATE stepready.steps SET wait = '{"signal": "s", "timeout_ms": 10}' WHERE id = $1`, ids["approve"])
		b.runToComplete(ids["charge"], `{}`, testBase)
		b.claim(10, testBase.Add(time.Second))
		b.requireState(ids["approve"], "error")
		require.True(t, b.boolCall(`SELECT stepready.retry_step_now($1, $2)`, ids["approve"], testBase.Add(time.Hour)))
		b.requireState(ids["approve"], "waiting")
		b.mustSend(taskID, "s", `{"by": "x"}`, testBase.Add(time.Hour))
		b.requireState(ids["approve"], "complete")
		// A waiting step is not retried by hand: it waits.
		_, w := b.waitTask(`{"signal": "s"}`, "")
		err := b.callErr(`SELECT stepready.retry_step_now($1)`, w)
		require.Equal(t, "55000", sqlState(err))
		require.Contains(t, err.Error(), "it is waiting")
	})

	t.Run("pause holds the dependents, not the clock", func(t *testing.T) {
		t.Parallel()
		b := lifecycleSetup(t)
		taskID, w := b.waitTask(`{"duration_ms": 1000}`, "")
		require.True(t, b.boolCall(`SELECT stepready.pause_task($1)`, taskID))
		_, reason := b.readiness(w, testBase)
		require.Equal(t, "task_paused", *reason)
		require.Empty(t, b.claim(10, testBase.Add(time.Hour)))
		b.requireState(w, "complete")
		after := b.stepIDs(taskID)["after"]
		_, reason = b.readiness(after, testBase.Add(time.Hour))
		require.Equal(t, "task_paused", *reason)
	})
}

func TestWaitStepsNeverReachAWorker(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	// Wait steps waiting, and one whose handler column reads "wait" like theirs: only the latter is claimed, by
	// every claim function, filtered or not.
	b.waitTask(`{"signal": "s"}`, "")
	b.waitTask(`{"until": "2100-01-01T00:00:00Z"}`, "")
	_, real := b.oneStep("")
	b.exec(`UPDATE stepready.steps SET handler = 'wait' WHERE id = $1`, real)
	var ids []int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT array_agg(step_id) FROM stepready.claim_ready_steps(10, 'w',
		60000, $1, NULL, ARRAY['wait'])`, testBase).Scan(&ids))
	require.Equal(t, []int64{real}, ids)
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT COALESCE(array_agg(step_id), '{}')
		FROM stepready.claim_and_start_steps(10, 'w', 60000, $1, ARRAY['default'], ARRAY['wait'])`, testBase).Scan(&ids))
	require.Empty(t, ids)
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.steps
		WHERE state = 'waiting' AND lease_owner IS NULL`).Scan(&n))
	require.Equal(t, 2, n)
}

func TestRetentionPrunesSignalsWithTheirTask(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	taskID, ids := b.approvalTask(`{"signal": "approval"}`)
	b.mustSend(taskID, "approval", `{"by": "x"}`, testBase)
	b.runToComplete(ids["charge"], `{}`, testBase)
	b.runToComplete(ids["ship"], `{}`, testBase)
	b.requireStatus(taskID, "complete")
	keep, _ := b.waitTask(`{"signal": "s"}`, "")
	b.mustSend(keep, "s", `{}`, testBase)
	require.Equal(t, 1, b.intCall(`SELECT stepready.prune_tasks($1)`, testBase.Add(time.Hour)))
	require.Empty(t, b.signals(taskID))
	require.Len(t, b.signals(keep), 1)
}

func TestSignalRoles(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	conns := map[string]*pgx.Conn{}
	for _, group := range []string{"stepready_client", "stepready_operator", "stepready_worker", "stepready_reader"} {
		taskID, w := b.waitTask(`{"signal": "s"}`, "")
		conn := roleConn(t, b.db, group)
		conns[group] = conn
		_, err := b.send(conn, taskID, "s", `{"from": "`+group+`"}`, nil, testBase)
		if group == "stepready_client" || group == "stepready_operator" {
			require.NoError(t, err, group)
			b.requireState(w, "complete")
			var n int
			require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM stepready.signals WHERE task_id = $1`,
				taskID).Scan(&n), group)
			require.Equal(t, 1, n)
		} else {
			require.Equal(t, "42501", sqlState(err), "%s: %v", group, err)
		}
		_, err = conn.Exec(b.ctx, `UPDATE stepready.signals SET consumed_by = NULL`)
		require.Equal(t, "42501", sqlState(err), group)
	}
	// A client's plain INSERT of a wait step: it starts waiting at commit (the trigger writes as its owner).
	tx, err := conns["stepready_client"].Begin(b.ctx)
	require.NoError(t, err)
	var taskID, w int64
	require.NoError(t, tx.QueryRow(b.ctx, `INSERT INTO stepready.tasks (name) VALUES ('p') RETURNING id`).Scan(&taskID))
	require.NoError(t, tx.QueryRow(b.ctx, `INSERT INTO stepready.steps (task_id, name, wait)
		VALUES ($1, 'w', '{"duration_ms": 5}') RETURNING id`, taskID).Scan(&w))
	require.NoError(t, tx.Commit(b.ctx))
	b.requireState(w, "waiting")
	// A worker's completion that starts a signal wait reads the mailbox (definer), and its claims fire timers.
	worker := conns["stepready_worker"]
	taskID2, ids := b.approvalTask(`{"signal": "approval", "timeout_ms": 5}`)
	b.mustSend(taskID2, "approval", `{"by": "w"}`, testBase)
	var rows []int64
	require.NoError(t, worker.QueryRow(b.ctx, `SELECT array_agg(step_id) FROM stepready.claim_and_start_steps(10, 'w',
		60000, $1)`, testBase).Scan(&rows))
	var ok bool
	require.NoError(t, worker.QueryRow(b.ctx, `SELECT stepready.complete_step($1, 1, '{}', $2)`, ids["charge"],
		testBase).Scan(&ok))
	require.True(t, ok)
	b.requireState(ids["approve"], "complete")
	require.NoError(t, worker.QueryRow(b.ctx, `SELECT count(*) FROM stepready.claim_ready_steps(10, 'w', 60000, $1)`,
		testBase.Add(time.Minute)).Scan(new(int)))
	b.requireState(w, "complete")
}

// Keep the imports used while the file grows.
var _ = json.Marshal
var _ = fmt.Sprintf
var _ = strings.Repeat
var _ sync.WaitGroup

// With many steps waiting, a claim and next_claim_at read the first entries of steps_wait_due_idx only, never a
// scan of the waiting steps (the 100,000-waiting benchmark's premise): the index statistics of the backend that
// ran them count what each index returned.
func TestTimersReadOnlyWhatIsDue(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	const n = 3000
	defs := make([]string, n)
	for i := range defs {
		wait := `{"signal": "go"}`
		if i%2 == 0 {
			wait = `{"until": "2100-01-01T00:00:00Z"}`
		}
		defs[i] = `{"name": "w", "steps": [{"name": "w", "wait": ` + wait + `}]}`
	}
	b.exec(`SELECT count(*) FROM stepready.create_tasks($1::jsonb)`, "["+strings.Join(defs, ",")+"]")
	_, due := b.waitTask(`{"until": "2020-01-01T00:00:00Z"}`, "")
	conn := b.db.Conn(t)
	read := func() map[string]int64 {
		t.Helper()
		_, err := conn.Exec(b.ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		rows, err := b.db.Pool.Query(b.ctx, `SELECT indexrelname::text, idx_tup_read FROM pg_catalog.pg_stat_user_indexes
			WHERE schemaname = 'stepready' AND relname = 'steps'`)
		require.NoError(t, err)
		got := map[string]int64{}
		var name string
		var v int64
		_, err = pgx.ForEachRow(rows, []any{&name, &v}, func() error { got[name] = v; return nil })
		require.NoError(t, err)
		return got
	}
	before := read()
	var claimed int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM stepready.claim_ready_steps(10, 'w', 60000, $1)`,
		testBase).Scan(&claimed))
	var next *time.Time
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT stepready.next_claim_at($1)`, testBase).Scan(&next))
	after := read()
	b.requireState(due, "complete")
	require.Equal(t, 1, claimed, "the dependent of the sleep that ended")
	require.NotNil(t, next)
	require.Zero(t, after["steps_waiting_signal_idx"]-before["steps_waiting_signal_idx"])
	require.Less(t, after["steps_wait_due_idx"]-before["steps_wait_due_idx"], int64(10))
}
