package builtin

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/steps"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestRegister(t *testing.T) {
	t.Parallel()

	t.Run("WithoutPool", func(t *testing.T) {
		t.Parallel()
		reg := steps.NewRegistry()
		require.NoError(t, Register(reg, Options{}))
		require.Equal(t, []string{"exec", "fail", "http", "noop", "sleep", "sql"}, reg.Names(), "sql registered disabled")

		h, ok := reg.Lookup("http")
		require.True(t, ok)
		require.NotNil(t, h.(*httpHandler).client, "a default client when Options.HTTPClient is nil")
	})

	t.Run("WithPool", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		client := &http.Client{}
		reg := steps.NewRegistry()
		require.NoError(t, Register(reg, Options{Pool: db.Pool, AllowExec: true, HTTPClient: client}))
		require.Equal(t, []string{"exec", "fail", "http", "noop", "sleep", "sql"}, reg.Names())

		h, _ := reg.Lookup("http")
		require.Same(t, client, h.(*httpHandler).client)
		h, _ = reg.Lookup("exec")
		require.IsType(t, &execHandler{}, h)
		h, _ = reg.Lookup("sql")
		require.Same(t, db.Pool, h.(*sqlHandler).pool)
	})

	t.Run("NameTaken", func(t *testing.T) {
		t.Parallel()
		reg := steps.NewRegistry()
		reg.MustRegister("sleep", steps.HandlerFunc(handleNoop))
		err := Register(reg, Options{})
		require.ErrorContains(t, err, `builtin: steps: register "sleep"`)
	})

	t.Run("ExecDisabledByDefault", func(t *testing.T) {
		t.Parallel()
		reg := steps.NewRegistry()
		require.NoError(t, Register(reg, Options{}))
		h, ok := reg.Lookup("exec")
		require.True(t, ok)

		_, err := run(context.Background(), h, `{"command": ["/bin/sh", "-c", "exit 0"]}`, 1)
		fail := requireClass(t, err, steps.ClassPermanent)
		require.Equal(t, "exec_disabled", fail.Code)
		require.ErrorContains(t, err, "exec handler is disabled")
		require.ErrorContains(t, err, "--allow-exec")
	})
}
