package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/internal/store"
	"github.com/stepready/stepready/schedules"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// TestPollOnlyClientBehindPgBouncer (issue 24): a Client with Config.PollOnly, given a pool whose URL is plain
// (pgx's default query mode, named prepared statements) on a real PgBouncer in transaction pooling mode, works
// in both dispatch modes: it runs its queries, and River's, on a pool of its own that prepares no named
// statement. Diamonds with a step that fails twice, and a schedule firing every second, run to completion; the
// client's pool is left as it was given; no log mentions a prepared statement. The same workload, the CLI and
// the console through PgBouncer are cmd/scheduler's TestBehindPgBouncer.
func TestPollOnlyClientBehindPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range dispatchModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			worker := b.pool.Config().ConnString() // the URL of setup's stepready_worker login role
			bouncer := pgtest.PgBouncer(t, worker)
			pcfg, err := pgxpool.ParseConfig(bouncer.URL(t, worker))
			require.NoError(t, err)
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			require.Equal(t, pgx.QueryExecModeCacheStatement, pool.Config().ConnConfig.DefaultQueryExecMode)
			b.pool = pool
			b.reg.MustRegister("flaky", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
				if s.Attempt <= 2 {
					return nil, steps.Fail(steps.ClassTransient, fmt.Errorf("attempt %d fails", s.Attempt))
				}
				return nil, nil
			}))

			var log lockedBuffer
			b.exec(t, `INSERT INTO stepready.task_templates (name, version, definition) VALUES ('tick', 1, $1)`, tickTemplate)
			b.putSchedule(t, schedules.Definition{Name: "tick", Template: "tick", Cron: "@every 1s"})
			var ids []int64
			for range 5 {
				ids = append(ids, b.createTask(t, `{"name": "pgb", "steps": [
					{"name": "a", "handler": "noop"},
					{"name": "b", "handler": "flaky", "depends_on": ["a"],
					 "retry": {"max_attempts": 4, "backoff": "fixed", "base_delay_ms": 50}},
					{"name": "c", "handler": "noop", "depends_on": ["a"]},
					{"name": "d", "handler": "noop", "depends_on": ["b", "c"]}]}`))
			}
			c := b.start(t, stepready.Config{Dispatch: mode, PollOnly: true, PollInterval: 100 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})

			for _, id := range ids {
				b.waitTask(t, id, time.Minute, "complete")
			}
			var attempts int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT sum(attempts) FROM stepready.steps
				WHERE task_id = ANY ($1) AND name = 'b'`, ids).Scan(&attempts))
			require.Equal(t, 3*len(ids), attempts, "each b failed twice, then succeeded")
			fires := b.waitFires(t, "tick", 2, time.Minute)
			for _, ft := range fires[:2] {
				var id int64
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id FROM stepready.tasks WHERE idempotency_key = $1`,
					"schedule:tick:"+ft.UTC().Format(time.RFC3339)).Scan(&id))
				b.waitTask(t, id, time.Minute, "complete")
			}

			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			require.NoError(t, c.Stop(stopCtx))
			require.Empty(t, pgtest.PoolerFailures(log.String()), "the client's log")
			require.Empty(t, pgtest.PoolerFailures(bouncer.Log()), "PgBouncer's log")
			require.Contains(t, log.String(), "query_exec_mode="+store.PoolerQueryExecMode.String())
			require.Equal(t, pgx.QueryExecModeCacheStatement, pool.Config().ConnConfig.DefaultQueryExecMode,
				"the caller's pool is left as it was")
			require.NoError(t, pool.Ping(ctx), "and open")
		})
	}
}
