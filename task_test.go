package stepready_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"
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
		name, def string
		want      []string // each must be in the error: the step, the rule index and field, CEL's own message
	}{
		{"bad CEL", `{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "fetch", "handler": "h",
			"rules": [{"when": "true", "then": {"do": "break"}}, {"when": "outcome.nope ==", "then": {"do": "fail"}}]}]}`,
			[]string{`steps[1] "fetch": rules[1].when: ` + celMessage(t, "outcome.nope =="),
				"Syntax error: mismatched input '<EOF>'"}},
		{"undeclared variable", `{"name": "t", "steps": [{"name": "a", "handler": "h",
			"rules": [{"when": "outcome.status == 'ok'", "then": {"do": "break"}}, {"when": "nope > 1", "then": {"do": "fail"}}]}]}`,
			[]string{`steps[0] "a": rules[1].when: ` + celMessage(t, "nope > 1"), "undeclared reference to 'nope'"}},
		{"non-bool when", `{"name": "t", "steps": [{"name": "a", "handler": "h",
			"rules": [{"when": "attempt + 1", "then": {"do": "fail"}}]}]}`,
			[]string{`steps[0] "a": rules[0].when: must evaluate to a bool, but "attempt + 1" has type int`}},
		{"unknown action", `{"name": "t", "steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h",
			"rules": [{"when": "true", "then": {"do": "retry"}}, {"when": "false", "then": {"do": "explode"}}]}]}`,
			[]string{`steps[1] "b": rules[1].then.do: must be one of retry, fail, continue, repeat, break, got "explode"`}},
		{"SQL validation", `{"name": "t", "steps": [{"name": "a", "handler": "h", "depends_on": ["zz"]}]}`,
			[]string{`steps[0] "a": depends_on: unknown step "zz"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := stepready.CreateTask(ctx, db.Pool, []byte(tc.def))
			require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
			for _, want := range tc.want {
				require.Contains(t, err.Error(), want)
			}
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

// celMessage is CEL's own message for an expression that does not compile in an environment without
// declarations: a syntax error or an undeclared reference reads the same in stepready's environment.
func celMessage(t *testing.T, expr string) string {
	t.Helper()
	env, err := cel.NewEnv()
	require.NoError(t, err)
	_, iss := env.Compile(expr)
	require.Error(t, iss.Err())
	return strings.TrimSpace(iss.Err().Error())
}
