package stepready_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// CreateTask accepts run_at (SPEC §15); a bad one is ErrInvalidDefinition naming the field.
func TestCreateTaskRunAt(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	id, err := stepready.CreateTask(ctx, db.Pool, []byte(`{"name": "later", "run_at": "2031-01-01T03:00:00+01:00",
		"steps": [{"name": "a", "handler": "h"}]}`))
	require.NoError(t, err)
	var runAt, next time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT t.run_at, s.next_attempt_at FROM stepready.tasks t
		JOIN stepready.steps s ON s.task_id = t.id WHERE t.id = $1`, id).Scan(&runAt, &next))
	want := time.Date(2031, 1, 1, 2, 0, 0, 0, time.UTC)
	require.True(t, want.Equal(runAt), "%s", runAt)
	require.True(t, want.Equal(next), "the first attempt waits for run_at: %s", next)

	_, err = stepready.CreateTask(ctx, db.Pool, []byte(`{"name": "bad", "run_at": "soon",
		"steps": [{"name": "a", "handler": "h"}]}`))
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	require.ErrorContains(t, err, `run_at: must be an RFC 3339 timestamp with an offset`)
}
