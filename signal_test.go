package stepready_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// SendSignal and SendSignalToKey are the one library call every face uses: the id, the actor in the event, the
// idempotency key, and errors that say why (ErrNotFound, ErrSignalRefused, ErrInvalidSignal).
func TestSendSignal(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	id, err := stepready.CreateTask(ctx, db.Pool, json.RawMessage(`{"name": "refund", "idempotency_key": "refund-9",
		"steps": [{"name": "approve", "wait": {"signal": "approval", "timeout_ms": 86400000}},
		          {"name": "late", "wait": {"signal": "approval"}},
		          {"name": "ship", "handler": "noop", "depends_on": ["approve"]}]}`))
	require.NoError(t, err)

	sid, err := stepready.SendSignal(ctx, db.Pool, id, "approval", json.RawMessage(`{"by": "ann"}`),
		stepready.SignalOptions{Actor: "ui", IdempotencyKey: "click-1"})
	require.NoError(t, err)
	again, err := stepready.SendSignal(ctx, db.Pool, id, "approval", nil,
		stepready.SignalOptions{IdempotencyKey: "click-1"})
	require.NoError(t, err)
	require.Equal(t, sid, again)
	var actor, output string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT details ->> 'actor' FROM stepready.step_events
		WHERE task_id = $1 AND event = 'signal.received'`, id).Scan(&actor))
	require.Equal(t, "ui", actor)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT output::text FROM stepready.steps
		WHERE task_id = $1 AND name = 'approve'`, id).Scan(&output))
	require.JSONEq(t, `{"by": "ann"}`, output)

	// By the task's key, with the default actor and an empty payload.
	_, err = stepready.SendSignalToKey(ctx, db.Pool, "refund-9", "approval", nil, stepready.SignalOptions{})
	require.NoError(t, err)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT details ->> 'actor' FROM stepready.step_events
		WHERE task_id = $1 AND event = 'signal.received' ORDER BY id DESC LIMIT 1`, id).Scan(&actor))
	require.Equal(t, stepready.ActorDefault, actor)

	_, err = stepready.SendSignal(ctx, db.Pool, id, "approval", nil, stepready.SignalOptions{})
	require.ErrorIs(t, err, stepready.ErrSignalRefused)
	require.ErrorContains(t, err, `no step of it that is not finished waits for "approval"`)
	_, err = stepready.SendSignal(ctx, db.Pool, id+100, "approval", nil, stepready.SignalOptions{})
	require.ErrorIs(t, err, stepready.ErrNotFound)
	_, err = stepready.SendSignalToKey(ctx, db.Pool, "nope", "approval", nil, stepready.SignalOptions{})
	require.ErrorIs(t, err, stepready.ErrNotFound)
	_, err = stepready.SendSignal(ctx, db.Pool, id, "", nil, stepready.SignalOptions{})
	require.ErrorIs(t, err, stepready.ErrInvalidSignal)
	_, err = stepready.SendSignal(ctx, db.Pool, id, "approval", json.RawMessage(`{nope`), stepready.SignalOptions{})
	require.ErrorIs(t, err, stepready.ErrInvalidSignal)
	require.ErrorContains(t, err, "payload: not a JSON document")
}

// A definition with both a handler and a wait is refused by CreateTask naming the step.
func TestCreateTaskRefusesHandlerAndWait(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := stepready.CreateTask(t.Context(), db.Pool, json.RawMessage(`{"name": "t", "steps": [
		{"name": "w", "handler": "noop", "wait": {"duration_ms": 10}}]}`))
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	require.ErrorContains(t, err, `steps[0] "w": handler and wait: a step has one or the other, not both`)
}
