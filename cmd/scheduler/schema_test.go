package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/migrations"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

// Every command, `run` and `ui` refuse (exit 2) a database that was never migrated, saying what to run, instead
// of failing later on a missing relation; a schema newer than the binary is named as such.
func TestCommandsRefuseADatabaseNotMigrated(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	for _, args := range [][]string{
		{"task", "list"},
		{"explain", "1"},
		{"policy", "list"},
		{"run", "--dispatch", "direct", "--wait-for-db", "0"},
		{"ui", "--addr", "127.0.0.1:0", "--wait-for-db", "0"},
	} {
		_, _, err := executeIsolated(t.Context(), t, append(args, "--database-url", db.URL)...)
		require.ErrorContains(t, err, "database not migrated: run `scheduler migrate up`", "%v", args)
		require.Equal(t, 2, exitCode(err), "%v", args)
	}

	b := cliSetup(t)
	b.exec(`UPDATE public.` + migrations.MigrationsTable + ` SET version = version + 1`)
	_, _, err := b.run("task", "list")
	require.ErrorContains(t, err, "is newer than this binary")
	require.Equal(t, 2, exitCode(err))
}

// A running daemon whose database changes under it (another version's migrate up) answers 503 on /healthz with
// what to do, and 200 again once the schema is its own.
func TestRunningDaemonWatchesTheSchema(t *testing.T) {
	t.Parallel()
	b := cliSetup(t)
	health, err := startHealthServer("127.0.0.1:0", prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer health.close()
	health.setStatus(healthRunning)
	ctx, cancel := context.WithCancel(t.Context())
	wait := watchSchema(ctx, b.pool, health, slog.New(slog.DiscardHandler), 20*time.Millisecond)
	defer func() { cancel(); wait() }()

	url := fmt.Sprintf("http://%s/healthz", health.addr())
	get := func() (int, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	code, _ := get()
	require.Equal(t, http.StatusOK, code)
	b.exec(`COMMENT ON SCHEMA stepready IS 'stepready functions of another build'`)
	require.Eventually(t, func() bool {
		code, body := get()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "functions of another build")
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, migrations.Up(t.Context(), b.db.URL, nil))
	require.Eventually(t, func() bool { code, _ := get(); return code == http.StatusOK }, 10*time.Second,
		10*time.Millisecond)
}
