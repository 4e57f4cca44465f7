package integration

import (
	"context"
	"os"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// TestEveryFunctionAndTableHasAGrantDecision: migrations/roles/roles.sql names every public function of schema
// stepready (the list of which role may execute it) and every table (in a GRANT or in its list of tables every
// role reads). A function or table added without a decision fails here, naming it.
func TestEveryFunctionAndTableHasAGrantDecision(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	roles, err := os.ReadFile("../../migrations/roles/roles.sql")
	require.NoError(t, err)
	text := string(roles)

	var functions, tables []string
	require.NoError(t, db.Pool.QueryRow(t.Context(), `
		SELECT array_agg(DISTINCT proname::text ORDER BY proname::text) FROM pg_catalog.pg_proc
		 WHERE pronamespace = 'stepready'::regnamespace AND proname NOT LIKE '\_%'`).Scan(&functions))
	for _, f := range functions {
		require.Regexp(t, regexp.MustCompile(`\('`+regexp.QuoteMeta(f)+`',\s+'\{`), text,
			"function stepready.%s has no grant decision in migrations/roles/roles.sql", f)
	}
	require.NoError(t, db.Pool.QueryRow(t.Context(), `
		SELECT array_agg(relname::text ORDER BY relname::text) FROM pg_catalog.pg_class
		 WHERE relnamespace = 'stepready'::regnamespace AND relkind IN ('r', 'p')`).Scan(&tables))
	for _, tbl := range tables {
		require.Contains(t, text, "stepready."+tbl,
			"table stepready.%s has no grant decision in migrations/roles/roles.sql", tbl)
	}
}

// roleConn connects to db as a new login role that is a member of group only.
func roleConn(t *testing.T, db *pgtest.DB, group string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), db.LoginRole(t, group))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestRolesDoTheirJobAndNothingElse: a login role granted one of the four roles of SPEC §17 can do that job and
// is refused (42501, insufficient privilege) the others' jobs.
func TestRolesDoTheirJobAndNothingElse(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	var taskID, stepID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`,
		mustJSON(t, chainDef("fixture", 2, ""))).Scan(&taskID))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT min(id) FROM stepready.steps WHERE task_id = $1`, taskID).Scan(&stepID))
	_, err := db.Pool.Exec(ctx, `INSERT INTO stepready.schedules (name, template, cron) VALUES ('s', 't', '@hourly')`)
	require.NoError(t, err)

	type check struct {
		name    string
		sql     string
		args    []any
		allowed bool
	}
	chain := mustJSON(t, chainDef("c", 2, ""))
	plainSQL := `WITH t AS (INSERT INTO stepready.tasks (name) VALUES ('plain') RETURNING id),
		s AS (INSERT INTO stepready.steps (task_id, name, handler) SELECT id, 'a', 'noop' FROM t RETURNING id)
		SELECT count(*) FROM s`
	common := []check{
		{"read tasks", `SELECT count(*) FROM stepready.tasks`, nil, true},
		{"step_readiness", `SELECT count(*) FROM stepready.step_readiness(ARRAY[$1::bigint])`, []any{taskID}, true},
		{"explain", `SELECT count(*) FROM stepready.explain_task($1)`, []any{taskID}, true},
	}
	updateState := check{"UPDATE steps.state", `UPDATE stepready.steps SET state = 'complete' WHERE id = $1`, []any{stepID}, false}
	cancel := check{"cancel_task", `SELECT stepready.cancel_task($1, 'no')`, []any{taskID}, false}
	claim := check{"claim", `SELECT count(*) FROM stepready.claim_ready_steps(10, 'w', 30000)`, nil, false}
	create := check{"create_task", `SELECT stepready.create_task($1::jsonb)`, []any{chain}, false}
	plain := check{"plain-SQL creation", plainSQL, nil, false}
	template := check{"write a template", `INSERT INTO stepready.task_templates (name, version, definition)
		VALUES ('x', 1, '{"steps": [{"name": "a", "handler": "noop"}]}')`, nil, false}
	schedule := check{"pause a schedule", `SELECT stepready.pause_schedule('s')`, nil, false}
	// SPEC §18: the output cap is the operator's to change.
	setting := check{"change max_output_bytes", `UPDATE stepready.settings SET value = '2097152' WHERE name = 'max_output_bytes'`, nil, false}
	allow := func(c check) check { c.allowed = true; return c }

	for _, tc := range []struct {
		group  string
		checks []check
	}{
		{"stepready_client", []check{allow(create), allow(plain), updateState, cancel, claim, template, schedule, setting}},
		{"stepready_worker", []check{allow(claim), allow(create), cancel, template, schedule, setting}},
		{"stepready_operator", []check{updateState, claim, create, plain, allow(template), allow(schedule), allow(cancel),
			allow(setting)}},
		{"stepready_reader", []check{updateState, cancel, claim, create, plain, template, schedule, setting}},
	} {
		t.Run(tc.group, func(t *testing.T) {
			conn := roleConn(t, db, tc.group)
			for _, c := range append(append([]check{}, common...), tc.checks...) {
				_, err := conn.Exec(ctx, c.sql, c.args...)
				if c.allowed {
					require.NoError(t, err, "%s: %s", tc.group, c.name)
					continue
				}
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, "%s may not: %s", tc.group, c.name)
				require.Equal(t, "42501", pgErr.Code, "%s: %s: %s", tc.group, c.name, pgErr.Message)
			}
		})
	}

	// The operator's cancel went through the audited function, as the role, with the event written.
	var events int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.step_events
		WHERE task_id = $1 AND event LIKE 'operator.%'`, taskID).Scan(&events))
	require.Positive(t, events)
}
