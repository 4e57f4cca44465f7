package e2e

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// daemonAppName is the application_name of the daemon's connections.
const daemonAppName = "stepready-daemon"

var dispatchModes = []string{stepready.DispatchDirect, stepready.DispatchRiver}

type bundle struct {
	db   *pgtest.DB
	pool *pgxpool.Pool // default search_path: River's tables are found there
	reg  *steps.Registry
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t)
	// The daemon's own pool, with the default search_path (River's tables are found there) and a name the
	// connection-loss test can aim at, as a login role that has only stepready_worker (SPEC §17): every test of
	// this package that runs a daemon in-process proves the worker's privileges are enough for its job.
	pcfg, err := pgxpool.ParseConfig(db.LoginRole(t, "stepready_worker"))
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["application_name"] = daemonAppName
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reg := steps.NewRegistry()
	reg.MustRegister("noop", steps.HandlerFunc(func(_ context.Context, s *steps.Step) (any, error) {
		return s.Input, nil
	}))
	return &bundle{db: db, pool: pool, reg: reg}
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("E2E_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// start starts a client with cfg (Registry filled in) and stops it at cleanup.
func (b *bundle) start(t *testing.T, cfg stepready.Config) *stepready.Client {
	t.Helper()
	cfg.Registry = b.reg
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	c, err := stepready.NewClient(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, c.Stop(ctx))
	})
	return c
}

func (b *bundle) createTask(t *testing.T, def string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT stepready.create_task($1)`, def).Scan(&id))
	return id
}

// waitTask polls the task's status until it is one of want or the deadline passes.
func (b *bundle) waitTask(t *testing.T, taskID int64, timeout time.Duration, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var status string
	for {
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT status FROM stepready.tasks WHERE id = $1`, taskID).Scan(&status))
		for _, w := range want {
			if status == w {
				return status
			}
		}
		if time.Now().After(deadline) {
			var dump string
			_ = b.db.Pool.QueryRow(context.Background(), `SELECT string_agg(format('%s %s attempts=%s next=%s held=%s pp=%s now=%s',
				name, state, attempts, next_attempt_at, task_held, pending_parents, now()), E'\n')
				FROM stepready.steps WHERE task_id = $1`, taskID).Scan(&dump)
			t.Fatalf("task %d: status %q after %s, want one of %v; steps:\n%s", taskID, status, timeout, want, dump)
		}
		<-time.After(10 * time.Millisecond)
	}
}
