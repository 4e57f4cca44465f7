package stepready_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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

// TestCreateTasks: many definitions in one call, one result per definition in order, idempotency within the
// batch, and CreateTask's checks with the definition's index in every error; nothing written on an error.
func TestCreateTasks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	def := func(name, key string) json.RawMessage {
		return json.RawMessage(`{"name": "` + name + `", "idempotency_key": "` + key + `",
			"steps": [{"name": "a", "handler": "h"}, {"name": "b", "handler": "h", "depends_on": ["a"]}]}`)
	}
	got, err := stepready.CreateTasks(ctx, db.Pool, []json.RawMessage{def("x", "k1"), def("y", "k2"), def("z", "k1")})
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.True(t, got[0].Created)
	require.True(t, got[1].Created)
	require.Equal(t, stepready.Created{TaskID: got[0].TaskID, Created: false}, got[2])

	again, err := stepready.CreateTasks(ctx, db.Pool, []json.RawMessage{def("y", "k2")})
	require.NoError(t, err)
	require.Equal(t, []stepready.Created{{TaskID: got[1].TaskID}}, again)

	empty, err := stepready.CreateTasks(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Empty(t, empty)

	for _, tc := range []struct {
		name string
		defs []json.RawMessage
		want string
	}{
		{"bad CEL", []json.RawMessage{def("ok", "n1"), json.RawMessage(`{"name": "t", "steps": [{"name": "a",
			"handler": "h", "rules": [{"when": "nope > 1", "then": {"do": "fail"}}]}]}`)},
			`definitions[1]: steps[0] "a": rules[0].when: ` + celMessage(t, "nope > 1")},
		{"SQL validation", []json.RawMessage{json.RawMessage(`{"name": "t", "steps": [{"name": "a", "handler": "h",
			"depends_on": ["zz"]}]}`), def("ok", "n2")}, `definitions[0]: steps[0] "a": depends_on: unknown step "zz"`},
		{"not UTF-8", []json.RawMessage{def("ok", "n3"), json.RawMessage("{\"name\": \"\xff\"}")},
			`definitions[1]: definition: not valid UTF-8 (at byte 10)`},
		{"not JSON", []json.RawMessage{def("ok", "n4"), json.RawMessage(`{"name": `)}, `definitions[1]: definition:`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := stepready.CreateTasks(ctx, db.Pool, tc.defs)
			require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&n))
	require.Equal(t, 2, n, "only the first call's two tasks")
}

// TestCreateTaskInEveryQueryMode: CreateTask and CreateTasks work whatever pgx query mode the caller's pool uses,
// including exec and simple_protocol, the modes that work through a transaction pooler (PgBouncer), which send
// a []byte parameter as bytea.
func TestCreateTaskInEveryQueryMode(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := db.NewPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			def := json.RawMessage(`{"name": "` + mode.String() + `", "steps": [{"name": "a", "handler": "h"}]}`)
			id, err := stepready.CreateTask(ctx, pool, def)
			require.NoError(t, err)
			require.Positive(t, id)
			got, err := stepready.CreateTasks(ctx, pool, []json.RawMessage{def, def})
			require.NoError(t, err)
			require.Len(t, got, 2)
			var names int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks WHERE name = $1`,
				mode.String()).Scan(&names))
			require.Equal(t, 3, names)
		})
	}
}

// TestCreateTasksInBatches: an input larger than a batch is created in several create_tasks calls, in order,
// with idempotency across batches; an error in a later batch names the definition's index in the whole input;
// with a pool the batches before it stay created and are returned, with a transaction nothing stays; running
// the corrected input again resumes by its idempotency keys. (Not parallel: it makes batches of 3.)
func TestCreateTasksInBatches(t *testing.T) {
	restore := stepready.SetCreateTasksBatch(3)
	defer restore()
	db := pgtest.New(t)
	ctx := context.Background()
	def := func(i int, key string, deps string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"name": "t%d", "idempotency_key": %q, "steps": [{"name": "a", "handler": "h"},
			{"name": "b", "handler": "h", "depends_on": [%s]}]}`, i, key, deps))
	}
	defs := make([]json.RawMessage, 8)
	for i := range defs {
		defs[i] = def(i, fmt.Sprintf("k%d", i), `"a"`)
	}
	defs[5] = def(5, "k1", `"a"`)    // the key of definitions[1], in another batch
	defs[7] = def(7, "k7", `"nope"`) // invalid, in the third batch
	count := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&n))
		return n
	}

	// In a transaction: all or nothing, whatever the batches.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = stepready.CreateTasks(ctx, tx, defs)
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, count())

	// With a pool: the first two batches are created and returned, the third is not.
	got, err := stepready.CreateTasks(ctx, db.Pool, defs)
	require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
	require.Equal(t, `definitions[7]: steps[1] "b": depends_on: unknown step "nope"`, pgErr.Message)
	require.Len(t, got, 6)
	require.Equal(t, stepready.Created{TaskID: got[1].TaskID, Created: false}, got[5], "a key of an earlier batch")
	for i, c := range got {
		require.Equal(t, i != 5, c.Created, "definitions[%d]", i)
		if i > 0 {
			require.Greater(t, c.TaskID, got[0].TaskID, "ids follow input order")
		}
	}
	require.Equal(t, 5, count())

	// Corrected and sent again: the keys find what the first run created, the rest is created.
	defs[7] = def(7, "k7", `"a"`)
	again, err := stepready.CreateTasks(ctx, db.Pool, defs)
	require.NoError(t, err)
	require.Len(t, again, 8)
	for i := range 6 {
		require.Equal(t, stepready.Created{TaskID: got[i].TaskID}, again[i], "definitions[%d]", i)
	}
	require.True(t, again[6].Created)
	require.True(t, again[7].Created)
	require.Equal(t, 7, count())
}

// Issue 25: a value River or the Go runtime would refuse later is an invalid definition now, through the library
// too, naming the step and the field, and nothing is written.
func TestCreateTaskRefusesValuesBeyondTheBounds(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	for def, want := range map[string]string{
		`{"name": "t", "steps": [{"name": "a", "handler": "noop", "queue": "Emails"}]}`:  `steps[0] "a": queue: must be a River queue name`,
		`{"name": "t", "steps": [{"name": "a", "handler": "noop", "timeout_ms": 1e16}]}`: `steps[0] "a": timeout_ms: must be at most 9223372036854 ms`,
	} {
		_, err := stepready.CreateTask(ctx, db.Pool, json.RawMessage(def))
		require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
		require.ErrorContains(t, err, want)
		_, err = stepready.CreateTasks(ctx, db.Pool, []json.RawMessage{
			json.RawMessage(`{"name": "ok", "steps": [{"name": "a", "handler": "noop"}]}`), json.RawMessage(def)})
		require.ErrorIs(t, err, stepready.ErrInvalidDefinition)
		require.ErrorContains(t, err, "definitions[1]: "+want)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks`).Scan(&n))
	require.Zero(t, n)
}
