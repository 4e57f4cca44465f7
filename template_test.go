package stepready_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// CreateTasksFromTemplate and CreateTaskFromTemplate: contexts merged over the template's, idempotency keys,
// run_at from RunAt or from the database's clock plus Delay, errors naming the index in the whole input across
// batches, a missing template.
func TestCreateTasksFromTemplate(t *testing.T) {
	restore := stepready.SetCreateTasksBatch(2)
	defer restore()
	db := pgtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO stepready.task_templates (name, definition) VALUES ('etl', $1::jsonb)`,
		`{"context": {"region": "eu", "day": "?"}, "steps": [{"name": "a", "handler": "h"}]}`)
	require.NoError(t, err)
	type row struct {
		Context json.RawMessage
		RunAt   *time.Time
		Key     *string
	}
	read := func(id int64) row {
		var r row
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT context, run_at, idempotency_key FROM stepready.tasks
			WHERE id = $1`, id).Scan(&r.Context, &r.RunAt, &r.Key))
		return r
	}

	got, err := stepready.CreateTasksFromTemplate(ctx, db.Pool, "etl", []stepready.FromTemplate{
		{Context: json.RawMessage(`{"day": "mon"}`), IdempotencyKey: "etl/mon"},
		{},
		{Context: json.RawMessage(`{"day": "tue"}`)},
		{Context: json.RawMessage(`{"day": "again"}`), IdempotencyKey: "etl/mon"},
	}, stepready.TemplateOptions{})
	require.NoError(t, err)
	require.Len(t, got, 4)
	require.Equal(t, []bool{true, true, true, false}, []bool{got[0].Created, got[1].Created, got[2].Created,
		got[3].Created})
	require.Equal(t, got[0].TaskID, got[3].TaskID, "the key of an earlier batch finds its task")
	require.JSONEq(t, `{"region": "eu", "day": "mon"}`, string(read(got[0].TaskID).Context))
	require.JSONEq(t, `{"region": "eu", "day": "?"}`, string(read(got[1].TaskID).Context), "no context: the template's")
	require.Nil(t, read(got[0].TaskID).RunAt)
	require.Equal(t, "etl/mon", *read(got[0].TaskID).Key)

	at := time.Date(2031, 5, 1, 12, 0, 0, 0, time.UTC)
	one, err := stepready.CreateTaskFromTemplate(ctx, db.Pool, "etl", stepready.FromTemplate{},
		stepready.TemplateOptions{RunAt: at})
	require.NoError(t, err)
	require.True(t, one.Created)
	require.True(t, at.Equal(*read(one.TaskID).RunAt))

	var before time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before))
	delayed, err := stepready.CreateTaskFromTemplate(ctx, db.Pool, "etl", stepready.FromTemplate{},
		stepready.TemplateOptions{Delay: time.Hour})
	require.NoError(t, err)
	runAt := *read(delayed.TaskID).RunAt
	require.False(t, runAt.Before(before.Add(time.Hour)), "run_at %s: the database's clock plus an hour", runAt)
	require.True(t, runAt.Before(before.Add(time.Hour+time.Minute)), "run_at %s", runAt)

	// The key finds its task: its run_at is left as it was.
	found, err := stepready.CreateTaskFromTemplate(ctx, db.Pool, "etl",
		stepready.FromTemplate{IdempotencyKey: "etl/mon"}, stepready.TemplateOptions{RunAt: at})
	require.NoError(t, err)
	require.Equal(t, stepready.Created{TaskID: got[0].TaskID}, found)
	require.Nil(t, read(got[0].TaskID).RunAt)

	// Errors: the index in the whole input (third batch), a missing template, bad options; nothing written in a
	// transaction.
	var count int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&count))
	tasks := make([]stepready.FromTemplate, 6)
	for i := range tasks {
		tasks[i].Context = json.RawMessage(fmt.Sprintf(`{"n": %d}`, i))
	}
	tasks[4].Context = json.RawMessage(`[1]`)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = stepready.CreateTasksFromTemplate(ctx, tx, "etl", tasks, stepready.TemplateOptions{})
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Contains(t, pgErr.Message, "definitions[4]: context: must be")
	require.NoError(t, tx.Rollback(ctx))
	var after int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&after))
	require.Equal(t, count, after)

	_, err = stepready.CreateTaskFromTemplate(ctx, db.Pool, "nope", stepready.FromTemplate{}, stepready.TemplateOptions{})
	require.ErrorIs(t, err, stepready.ErrNotFound)
	require.ErrorContains(t, err, `template "nope" does not exist`)
	_, err = stepready.CreateTaskFromTemplate(ctx, db.Pool, "etl", stepready.FromTemplate{},
		stepready.TemplateOptions{RunAt: at, Delay: time.Hour})
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	_, err = stepready.CreateTaskFromTemplate(ctx, db.Pool, "etl", stepready.FromTemplate{},
		stepready.TemplateOptions{Delay: -time.Second})
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	_, err = stepready.CreateTaskFromTemplate(ctx, db.Pool, "etl",
		stepready.FromTemplate{Context: []byte("{\"a\": \"\xff\"}")}, stepready.TemplateOptions{})
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	require.ErrorContains(t, err, "definitions[0]: context: not valid UTF-8")
}
