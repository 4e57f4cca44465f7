package dispatch_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/dispatch"
	"github.com/stepready/stepready/internal/worker"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// Every claim transaction announces its jobs on River's own insert channel, as River's listener resolves it,
// even when River's client holds back its announcement (at most one per FetchCooldown and queue): otherwise a job
// inserted soon after another would wait for River's fetch poll.
func TestRiverDispatchAnnouncesEveryClaim(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	// River's queries name its tables without a schema: a pool with the server's default search_path.
	pool, err := pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	defer pool.Close()

	listener := riverpgxv5.New(pool).GetListener(&riverdriver.GetListenenerParams{})
	require.NoError(t, listener.Connect(ctx))
	defer func() { _ = listener.Close(context.WithoutCancel(ctx)) }()
	require.NoError(t, listener.Listen(ctx, "river_insert"))

	reg := steps.NewRegistry()
	reg.MustRegister("h", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) { return nil, nil }))
	exec := &worker.Executor{Pool: pool, Registry: reg, Worker: "w", Lease: time.Minute}
	// River's own announcement of an insert comes at most once an hour here.
	r, err := dispatch.NewRiver(dispatch.WithFetchCooldown(dispatch.RiverConfig{Pool: pool, Executor: exec,
		Concurrency: 10, Logger: slog.New(slog.DiscardHandler)}, time.Hour))
	require.NoError(t, err)

	for i := range 3 {
		_, err := pool.Exec(ctx, `SELECT stepready.create_task('{"name": "t", "steps": [{"name": "s", "handler": "h"}]}')`)
		require.NoError(t, err)
		n, _, err := r.Dispatch(ctx, 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		note, err := listener.WaitForNotification(waitCtx)
		cancel()
		require.NoError(t, err, "claim %d was not announced", i+1)
		require.Equal(t, "river_insert", note.Topic)
		var payload struct {
			Queue string `json:"queue"`
		}
		require.NoError(t, json.Unmarshal([]byte(note.Payload), &payload))
		require.Equal(t, "default", payload.Queue)
	}
	// One announcement per transaction: River's own (the first claim's) folds with the dispatcher's.
	waitCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = listener.WaitForNotification(waitCtx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "no notification beyond one per claim")
}
