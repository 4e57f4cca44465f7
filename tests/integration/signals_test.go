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

// Keep the imports used while the file grows.
var _ = json.Marshal
var _ = fmt.Sprintf
var _ = strings.Repeat
var _ sync.WaitGroup
