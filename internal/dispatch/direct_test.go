package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/dispatch"
	"github.com/stepready/stepready/internal/worker"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// A handler's slot is free as soon as the handler returns, while its outcome still waits to be recorded; at most
// twice the concurrency of attempts are unrecorded at once.
func TestDirectFreesSlotsBeforeRecordingAndBoundsWhatWaits(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	for range 6 {
		_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task('{"name": "t", "steps": [{"name": "s", "handler": "noop"}]}')`)
		require.NoError(t, err)
	}
	// Completing a step waits while this test holds advisory lock 4242: outcomes cannot be recorded meanwhile.
	_, err := db.Pool.Exec(ctx, `
		CREATE FUNCTION public.hold_completion() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN NEW; END $$;
		CREATE TRIGGER hold_completion BEFORE UPDATE ON stepready.steps
			FOR EACH ROW WHEN (NEW.state = 'complete') EXECUTE FUNCTION public.hold_completion();`)
	require.NoError(t, err)
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(4242)`)
	require.NoError(t, err)

	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) { return nil, nil }))
	exec := &worker.Executor{Pool: db.Pool, Registry: reg, Worker: "w", Lease: time.Minute}
	exec.Recorder = worker.NewBatchRecorder(db.Pool, 0, nil)
	d := dispatch.NewDirect(db.Pool, exec, 2, nil, nil)
	defer func() {
		d.Shutdown(context.WithoutCancel(ctx))
		exec.Recorder.Stop()
	}()

	free := func() int {
		n, err := d.Free(ctx)
		require.NoError(t, err)
		return n
	}
	waitFree := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for free() != want {
			require.True(t, time.Now().Before(deadline), "free capacity is %d, want %d", free(), want)
			select {
			case <-d.Freed():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	inProgress := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE state = 'in_progress'`).Scan(&n))
		return n
	}

	require.Equal(t, 2, free())
	n, _, err := d.Dispatch(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	waitFree(2) // both handlers returned: their slots are free, their outcomes are not recorded
	require.Equal(t, 2, inProgress())

	n, _, err = d.Dispatch(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	waitFree(0) // four outcomes wait: twice the concurrency, nothing more is claimed
	require.Equal(t, 4, inProgress())

	require.NoError(t, holder.Rollback(ctx)) // the database records again
	deadline := time.Now().Add(10 * time.Second)
	for inProgress() > 0 {
		require.True(t, time.Now().Before(deadline), "outcomes still unrecorded")
		select {
		case <-d.Freed():
		case <-time.After(10 * time.Millisecond):
		}
	}
	waitFree(2)
	var complete int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE state = 'complete'`).Scan(&complete))
	require.Equal(t, 4, complete)
}
