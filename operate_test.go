package stepready_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// Every operator action is one library call: it returns what changed, records its actor, refuses impossible
// transitions with the database's message and says when the task or step does not exist.
func TestOperatorActions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	id, err := stepready.CreateTask(ctx, db.Pool, json.RawMessage(`{"name": "t", "steps": [
		{"name": "a", "handler": "noop"}, {"name": "b", "handler": "noop", "depends_on": ["a"]}]}`))
	require.NoError(t, err)
	var a, b int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT min(id), max(id) FROM stepready.steps WHERE task_id = $1`, id).
		Scan(&a, &b))
	who := stepready.OperatorOptions{Actor: "alice"}

	ch, err := stepready.PauseTask(ctx, db.Pool, id, who)
	require.NoError(t, err)
	require.Equal(t, &stepready.TaskChange{TaskID: id, Action: "pause", Changed: true, PreviousStatus: "pending",
		Status: "pending", Paused: true}, ch)
	ch, err = stepready.PauseTask(ctx, db.Pool, id, who)
	require.NoError(t, err)
	require.False(t, ch.Changed, "already paused")
	ch, err = stepready.ResumeTask(ctx, db.Pool, id, stepready.OperatorOptions{})
	require.NoError(t, err)
	require.True(t, ch.PreviousPaused)
	require.False(t, ch.Paused)

	sc, err := stepready.ResolveStep(ctx, db.Pool, a, json.RawMessage(`{"by": "hand"}`), who)
	require.NoError(t, err)
	require.Equal(t, "pending", sc.PreviousState)
	require.Equal(t, "resolved_manually", sc.State)
	require.JSONEq(t, `{"by": "hand"}`, string(sc.Output))
	_, err = stepready.ResolveStep(ctx, db.Pool, a, json.RawMessage(`{"again": 1}`), who)
	require.ErrorContains(t, err, "resolved_manually", "the database's refusal")
	_, err = stepready.ResolveStep(ctx, db.Pool, b, json.RawMessage(`{nope`), who)
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)

	ch, err = stepready.CancelTask(ctx, db.Pool, id, "wrong input", who)
	require.NoError(t, err)
	require.Equal(t, int32(1), *ch.StepsAffected)
	require.Equal(t, "cancelled", ch.Status)
	ch, err = stepready.ResetTask(ctx, db.Pool, id, who)
	require.NoError(t, err)
	require.Equal(t, "cancelled", ch.PreviousStatus)
	require.Equal(t, int32(1), *ch.StepsAffected)
	sc, err = stepready.RetryStepNow(ctx, db.Pool, b, who)
	require.NoError(t, err)
	require.Equal(t, "pending", sc.State)
	require.Nil(t, sc.Output, "retry shows no output")

	// Inside the caller's transaction: a savepoint, undone with it.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = stepready.PauseTask(ctx, tx, id, who)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	var paused bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT paused FROM stepready.tasks WHERE id = $1`, id).Scan(&paused))
	require.False(t, paused)

	var actors []string
	rows, err := db.Pool.Query(ctx, `SELECT details ->> 'actor' FROM stepready.step_events
		WHERE task_id = $1 AND event LIKE 'operator.%' ORDER BY id`, id)
	require.NoError(t, err)
	actors, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"alice", "library"}, actors[:2], "pause by alice, resume with no actor named")
	for _, a := range actors[2:] {
		require.Equal(t, "alice", a)
	}

	_, err = stepready.CancelTask(ctx, db.Pool, id+100, "", who)
	require.ErrorIs(t, err, stepready.ErrNotFound)
	require.EqualError(t, err, "task "+strconv.FormatInt(id+100, 10)+" does not exist")
	_, err = stepready.RetryStepNow(ctx, db.Pool, b+100, who)
	require.ErrorIs(t, err, stepready.ErrNotFound)
}
