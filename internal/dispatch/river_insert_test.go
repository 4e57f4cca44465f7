package dispatch_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/internal/dispatch"
	"github.com/stepready/stepready/internal/worker"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// Issue 25: one claimed row that cannot be dispatched never stops a claim. The row is written around the tables'
// constraints (they are dropped in this test's database); its step fails alone, with class deterministic, in the
// claim's transaction, and the healthy steps of the same claim get their River jobs. Both ways are tested: the
// dispatcher's own check of the row, and, with that check off, River refusing the batch (the claim is made again
// with one job per savepoint).
func TestRiverDispatchFailsAloneAStepItCannotDispatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		cfg      func(dispatch.RiverConfig) dispatch.RiverConfig
		messages []string
	}{
		{"checked before the insert", func(c dispatch.RiverConfig) dispatch.RiverConfig { return c },
			[]string{`step "bad" cannot be dispatched: queue: must be a River queue name`, `"Bad Queue!"`}},
		{"refused by River", dispatch.WithoutRowCheck,
			[]string{`step "bad" cannot be dispatched: River refused its job: queue name is invalid`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx := t.Context()
			pool, err := pgxpool.New(ctx, db.URL) // River's tables are found with the default search_path
			require.NoError(t, err)
			defer pool.Close()

			_, err = db.Pool.Exec(ctx, `ALTER TABLE stepready.steps DROP CONSTRAINT steps_queue_is_a_river_queue_name`)
			require.NoError(t, err)
			for i := range 5 {
				_, err := db.Pool.Exec(ctx, `SELECT stepready.create_task($1)`,
					fmt.Sprintf(`{"name": "ok%d", "steps": [{"name": "ok", "handler": "h"}]}`, i))
				require.NoError(t, err)
			}
			var badID int64
			_, err = db.Pool.Exec(ctx,
				`SELECT stepready.create_task('{"name": "bad", "steps": [{"name": "bad", "handler": "h"}]}')`)
			require.NoError(t, err)
			require.NoError(t, db.Pool.QueryRow(ctx, `UPDATE stepready.steps SET queue = 'Bad Queue!'
				WHERE name = 'bad' RETURNING id`).Scan(&badID))

			reg := steps.NewRegistry()
			reg.MustRegister("h", steps.HandlerFunc(func(context.Context, *steps.Step) (any, error) { return nil, nil }))
			exec := &worker.Executor{Pool: pool, Registry: reg, Worker: "w", Lease: time.Minute}
			// The claim takes the bad queue too, which a dispatcher never claims on its own (its claims name its
			// River client's queues): the row check and River's refusal are the guards behind that.
			r, err := dispatch.NewRiver(tc.cfg(dispatch.WithClaimQueues(dispatch.RiverConfig{Pool: pool, Executor: exec,
				Concurrency: 10, Logger: slog.New(slog.DiscardHandler)}, "default", "Bad Queue!")))
			require.NoError(t, err)

			n, _, err := r.Dispatch(ctx, 10)
			require.NoError(t, err)
			require.Equal(t, 6, n)

			var jobs, enqueued int
			require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM river_job),
				(SELECT count(*) FROM stepready.steps WHERE state = 'enqueued')`).Scan(&jobs, &enqueued))
			require.Equal(t, 5, jobs, "the healthy steps' jobs are inserted")
			require.Equal(t, 5, enqueued)

			var state, class, message, taskStatus string
			var attempts int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT s.state, s.last_error ->> 'class',
				s.last_error ->> 'message', s.attempts, t.status
				FROM stepready.steps s JOIN stepready.tasks t ON t.id = s.task_id WHERE s.id = $1`, badID).
				Scan(&state, &class, &message, &attempts, &taskStatus))
			require.Equal(t, "error", state)
			require.Equal(t, "deterministic", class)
			require.Equal(t, 1, attempts)
			require.Equal(t, "error", taskStatus)
			for _, m := range tc.messages {
				require.Contains(t, message, m)
			}

			// The next claim finds nothing left: the bad step is not claimed over and over.
			n, _, err = r.Dispatch(ctx, 10)
			require.NoError(t, err)
			require.Zero(t, n)
		})
	}
}
