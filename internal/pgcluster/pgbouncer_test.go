package pgcluster

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestPgBouncer: a PgBouncer in transaction pooling mode in front of a throwaway cluster, not as root, as strict as
// a production one about startup parameters; Stop ends it and removes its directory.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := StartThrowaway(b.ctx, ThrowawayOptions{Settings: FastSettings, Logger: b.logger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Stop(b.ctx)) })

	bouncer, err := StartPgBouncer(b.ctx, PgBouncerOptions{Upstream: c.URL, Users: []string{"postgres"}, Logger: b.logger})
	if errors.Is(err, ErrNoPgBouncer) {
		if os.Getenv("CI") == "true" {
			t.Fatal("no pgbouncer found in CI (install the pgbouncer package; .ci/run does)")
		}
		t.Skip("no pgbouncer installed (apt-get install pgbouncer)")
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = bouncer.Stop() })
	if os.Geteuid() == 0 {
		status, err := os.ReadFile("/proc/" + strconv.Itoa(bouncer.cmd.Process.Pid) + "/status")
		require.NoError(t, err)
		require.NotContains(t, string(status), "\nUid:\t0\t", "as root, PgBouncer runs as an unprivileged user")
	}

	url, err := bouncer.URL(c.URL + "&default_query_exec_mode=exec")
	require.NoError(t, err)
	require.Equal(t, "postgres://postgres@127.0.0.1:"+strconv.Itoa(bouncer.Port)+
		"/postgres?sslmode=disable&default_query_exec_mode=exec", url)
	require.Equal(t, int32(3), query[int32](t, b.ctx, url, "SELECT 1 + 2"))

	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.RuntimeParams["stepready.actor"] = "cli"
	_, err = pgx.ConnectConfig(b.ctx, cfg)
	require.ErrorContains(t, err, "unsupported startup parameter")
	require.True(t, strings.Contains(bouncer.Log(), "unsupported startup parameter"), bouncer.Log())

	require.NoError(t, bouncer.Stop())
	require.NoError(t, bouncer.Stop(), "Stop is idempotent")
	_, err = os.Stat(bouncer.Dir)
	require.ErrorIs(t, err, fs.ErrNotExist, "the directory is removed")
}
