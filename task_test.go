package stepready_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready"
	"github.com/stepready/stepready/tests/integration/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestCreateTaskValidatesRulesBeforeWriting(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	cases := []struct {
		name, def, msg string
	}{
		{"bad CEL", `{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "fetch", "handler": "h",
			"rules": [{"when": "true", "then": {"do": "break"}}, {"when": "outcome.nope ==", "then": {"do": "fail"}}]}]}`,
			`steps[1] "fetch": rules[1].when`},
		{"non-bool when", `{"name": "t", "steps": [{"name": "a", "handler": "h",
			"rules": [{"when": "attempt + 1", "then": {"do": "fail"}}]}]}`, `steps[0] "a": rules[0].when`},
		{"SQL validation", `{"name": "t", "steps": [{"name": "a", "handler": "h", "depends_on": ["zz"]}]}`,
			`steps[0] "a": depends_on: unknown step "zz"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := stepready.CreateTask(ctx, db.Pool, []byte(tc.def))
			require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&n))
	require.Zero(t, n, "nothing written")

	id, err := stepready.CreateTask(ctx, db.Pool, []byte(`{"name": "ok", "steps": [{"name": "a", "handler": "h",
		"rules": [{"when": "outcome.status == 'error'", "then": {"do": "retry", "max_attempts": 5}}]}]}`))
	require.NoError(t, err)
	require.Positive(t, id)
	require.False(t, errors.Is(err, stepready.ErrInvalidDefinition))
}
