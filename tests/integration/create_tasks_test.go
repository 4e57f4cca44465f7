package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// ctRow is one row of stepready.create_tasks.
type ctRow struct {
	Ordinal int32
	TaskID  int64
	Created bool
}

func createTasks(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, defs string) ([]ctRow, error) {
	t.Helper()
	rows, err := db.Query(t.Context(), `SELECT ordinal, task_id, created FROM stepready.create_tasks($1::jsonb)`, defs)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[ctRow])
}

// chainDef is a definition of an n-step chain s1 -> s2 -> … with an optional idempotency key.
func chainDef(name string, n int, key string) map[string]any {
	steps := make([]map[string]any, n)
	for i := range steps {
		steps[i] = map[string]any{"name": fmt.Sprintf("s%d", i+1), "handler": "noop"}
		if i > 0 {
			steps[i]["depends_on"] = []string{fmt.Sprintf("s%d", i)}
		}
	}
	d := map[string]any{"name": name, "steps": steps}
	if key != "" {
		d["idempotency_key"] = key
	}
	return d
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func countTasks(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM stepready.tasks`).Scan(&n))
	return n
}

// TestCreateTasksRowsInInputOrder: one row per element, ordinal from 1, each task written as create_task writes
// one (steps in definition order, edges, pending parents, counters), and idempotency within the call and
// against existing keys.
func TestCreateTasksRowsInInputOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()

	var existing int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`,
		mustJSON(t, chainDef("old", 1, "k-old"))).Scan(&existing))

	defs := []any{
		chainDef("a", 3, "k-a"),
		chainDef("b", 2, ""),
		chainDef("a-again", 1, "k-a"),     // same key as element 1: its task
		chainDef("old-again", 2, "k-old"), // an existing key: that task
		map[string]any{"name": "diamond", "steps": []any{
			map[string]any{"name": "d", "handler": "noop", "depends_on": []string{"b", "c"}},
			map[string]any{"name": "b", "handler": "noop", "depends_on": []string{"a"}},
			map[string]any{"name": "c", "handler": "noop", "depends_on": []string{"a"}},
			map[string]any{"name": "a", "handler": "noop"},
		}},
	}
	got, err := createTasks(t, db.Pool, mustJSON(t, defs))
	require.NoError(t, err)
	require.Len(t, got, 5)
	for i, r := range got {
		require.Equal(t, int32(i+1), r.Ordinal)
	}
	require.True(t, got[0].Created)
	require.True(t, got[1].Created)
	require.Equal(t, ctRow{3, got[0].TaskID, false}, got[2])
	require.Equal(t, ctRow{4, existing, false}, got[3])
	require.True(t, got[4].Created)
	require.Less(t, got[0].TaskID, got[1].TaskID, "ids follow input order")
	require.Less(t, got[1].TaskID, got[4].TaskID, "ids follow input order")
	require.Equal(t, 4, countTasks(t, db), "old, a, b, diamond")

	// Steps in definition order (ids ascending), edges, pending parents and the task counters.
	type stepRow struct {
		Name    string
		Pending int32
	}
	rows, err := db.Pool.Query(ctx, `SELECT name, pending_parents FROM stepready.steps WHERE task_id = $1 ORDER BY id`,
		got[4].TaskID)
	require.NoError(t, err)
	steps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stepRow])
	require.NoError(t, err)
	require.Equal(t, []stepRow{{"d", 2}, {"b", 1}, {"c", 1}, {"a", 0}}, steps)
	var edges []string
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT array_agg(p.name || '->' || c.name ORDER BY p.name, c.name)
		  FROM stepready.step_edges e JOIN stepready.steps p ON p.id = e.parent_step_id
		  JOIN stepready.steps c ON c.id = e.child_step_id WHERE c.task_id = $1`, got[4].TaskID).Scan(&edges))
	require.Equal(t, []string{"a->b", "a->c", "b->d", "c->d"}, edges)
	var total, unsat int32
	var status string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT steps_total, steps_unsatisfied, status FROM stepready.tasks
		WHERE id = $1`, got[0].TaskID).Scan(&total, &unsat, &status))
	require.Equal(t, []any{int32(3), int32(3), "pending"}, []any{total, unsat, status})

	// The same call again creates nothing new for keyed elements and everything for the others.
	again, err := createTasks(t, db.Pool, mustJSON(t, defs))
	require.NoError(t, err)
	require.Equal(t, ctRow{1, got[0].TaskID, false}, again[0])
	require.True(t, again[1].Created)
	require.NotEqual(t, got[1].TaskID, again[1].TaskID)
}

// TestCreateTasksAllOrNothing: one invalid element raises an error naming definitions[i] (0-based) and the
// field, with SQLSTATE 22023, and nothing of the call is written.
func TestCreateTasksAllOrNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	good := chainDef("good", 2, "")
	cases := []struct {
		name string
		defs string
		want string
	}{
		{"unknown dependency", mustJSON(t, []any{good, good, map[string]any{"name": "bad", "steps": []any{
			map[string]any{"name": "x", "handler": "noop", "depends_on": []string{"nope"}}}}}),
			`definitions[2]: steps[0] "x": depends_on: unknown step "nope"`},
		{"first element", mustJSON(t, []any{map[string]any{"steps": []any{}}, good}), `definitions[0]: name: is required`},
		{"not an object", mustJSON(t, []any{good, 42}), `definitions[1]: definition: must be a JSON object`},
		{"cycle", mustJSON(t, []any{good, map[string]any{"name": "c", "steps": []any{
			map[string]any{"name": "x", "handler": "noop", "depends_on": []string{"y"}},
			map[string]any{"name": "y", "handler": "noop", "depends_on": []string{"x"}}}}}),
			`definitions[1]: steps[`},
		{"unknown preset", mustJSON(t, []any{good, map[string]any{"name": "p", "retry": map[string]any{"policy": "nope"},
			"steps": []any{map[string]any{"name": "x", "handler": "noop"}}}}), `definitions[1]: retry.policy: unknown preset "nope"`},
		{"not an array", `{"name": "x"}`, `definitions: must be a JSON array of task definitions, got object`},
		{"null", `null`, `definitions: must be a JSON array of task definitions, got null`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := createTasks(t, db.Pool, tc.defs)
			require.Error(t, err)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "22023", pgErr.Code)
			require.Contains(t, pgErr.Message, tc.want)
			require.Equal(t, 0, countTasks(t, db), "nothing written")
		})
	}

	// A single definition through create_task keeps its messages without the prefix.
	_, err := db.Pool.Exec(t.Context(), `SELECT stepready.create_task($1::jsonb)`, `{"steps": []}`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "name: is required", pgErr.Message)

	// An empty array creates nothing and returns no row.
	got, err := createTasks(t, db.Pool, `[]`)
	require.NoError(t, err)
	require.Empty(t, got)
}

// TestCreateTasksConcurrentKey: two calls racing on one idempotency key create one task; the one that waited
// returns it with created = false.
func TestCreateTasksConcurrentKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	defs := mustJSON(t, []any{chainDef("x", 2, "race"), chainDef("y", 1, "")})

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	first, err := createTasks(t, tx, defs)
	require.NoError(t, err)
	require.True(t, first[0].Created)

	done := make(chan []ctRow, 1)
	errs := make(chan error, 1)
	go func() {
		rows, err := db.Pool.Query(ctx, `SELECT ordinal, task_id, created FROM stepready.create_tasks($1::jsonb)`, defs)
		if err != nil {
			errs <- err
			return
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ctRow])
		if err != nil {
			errs <- err
			return
		}
		done <- got
	}()
	// The second call waits on the first one's index entry for the key.
	require.Eventually(t, func() bool {
		var waiting bool
		_ = db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%create_tasks%')`).Scan(&waiting)
		return waiting
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-errs:
		require.NoError(t, err)
	case got := <-done:
		require.Equal(t, ctRow{1, first[0].TaskID, false}, got[0])
		require.True(t, got[1].Created)
	case <-time.After(10 * time.Second):
		t.Fatal("the second create_tasks did not return")
	}
	require.Equal(t, 3, countTasks(t, db))
}

// TestCreateTasksFromTemplate: one task per context, contexts merged over the template's, keys paired by
// position (NULL for none), and the errors of a bad call.
func TestCreateTasksFromTemplate(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	_, err := db.Pool.Exec(ctx, `INSERT INTO stepready.task_templates (name, version, definition)
		VALUES ('etl', 1, '{"context": {"a": 1, "b": 1}, "steps": [{"name": "s", "handler": "noop"}]}')`)
	require.NoError(t, err)

	rows, err := db.Pool.Query(ctx, `SELECT ordinal, task_id, created FROM stepready.create_tasks_from_template(
		'etl', '[{"b": 2}, {"c": 3}, {"b": 9}]', ARRAY['k1', NULL, 'k1'])`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ctRow])
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.True(t, got[0].Created)
	require.True(t, got[1].Created)
	require.Equal(t, ctRow{3, got[0].TaskID, false}, got[2], "a repeated key answers with the first task")
	var contexts []string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT array_agg(context::text || ' ' || name || ' ' ||
		COALESCE(idempotency_key, '-') ORDER BY id) FROM stepready.tasks`).Scan(&contexts))
	require.Equal(t, []string{`{"a": 1, "b": 2} etl k1`, `{"a": 1, "b": 1, "c": 3} etl -`}, contexts)

	for _, tc := range []struct {
		name, sql, code, msg string
	}{
		{"length mismatch", `SELECT * FROM stepready.create_tasks_from_template('etl', '[{}]', ARRAY['a', 'b'])`,
			"22023", "idempotency_keys: has 2 keys for 1 contexts"},
		{"not an array", `SELECT * FROM stepready.create_tasks_from_template('etl', '{}')`,
			"22023", "contexts: must be a JSON array of contexts, got object"},
		{"missing template", `SELECT * FROM stepready.create_tasks_from_template('nope', '[{}]')`,
			"P0002", `template "nope" does not exist`},
	} {
		_, err := db.Pool.Exec(ctx, tc.sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, tc.name)
		require.Equal(t, tc.code, pgErr.Code, tc.name)
		require.Contains(t, pgErr.Message, tc.msg, tc.name)
	}
	require.Equal(t, 2, countTasks(t, db))
}

// creationReads is what creating tasks read from the tables of a task: rows returned by sequential scans and
// by index scans, summed over tasks, steps and step_edges.
type creationReads struct{ seq, idx int64 }

func readCreationStats(t *testing.T, conn *pgx.Conn) creationReads {
	t.Helper()
	ctx := t.Context()
	_, err := conn.Exec(ctx, `SELECT pg_catalog.pg_stat_force_next_flush()`)
	require.NoError(t, err)
	var r creationReads
	require.NoError(t, conn.QueryRow(ctx, `
		SELECT COALESCE(sum(seq_tup_read), 0)::bigint, COALESCE(sum(idx_tup_fetch), 0)::bigint
		  FROM pg_catalog.pg_stat_user_tables
		 WHERE schemaname = 'stepready' AND relname IN ('tasks', 'steps', 'step_edges')`).Scan(&r.seq, &r.idx))
	return r
}

// TestCreationReadsBoundedRowsPerTask: creating a task reads the same small number of rows whether the tables
// hold a hundred tasks or thousands more, never reads by a sequential scan, and never JIT-compiles a statement,
// whatever the statistics say: on a freshly migrated database that was never analyzed, on one analyzed while
// empty, and on one filled through create_tasks whose statistics were taken after its first 1,000 tasks, with
// JIT as eager as it gets (jit_above_cost = 0) on the creating session (SPEC §12: the rate of a create_task loop
// must not fall as the tables grow; issue 20: with statistics gathered mid-load, the edge trigger's cycle check
// was JIT-compiled for every edge). The plans of a session are made for its first calls, when the tables are
// tiny: they must be index plans by construction.
func TestCreationReadsBoundedRowsPerTask(t *testing.T) {
	t.Parallel()
	for _, mode := range []creationStats{neverAnalyzed, analyzedEmpty, analyzedMidLoad} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			testCreationReads(t, mode)
		})
	}
}

// creationStats is the state of the planner statistics while TestCreationReadsBoundedRowsPerTask creates tasks.
type creationStats string

const (
	neverAnalyzed   creationStats = "never analyzed"
	analyzedEmpty   creationStats = "analyzed while empty"
	analyzedMidLoad creationStats = "analyzed after 1,000 tasks, JIT eager"
)

// eagerJIT makes conn JIT-compile every statement whose plan costs anything (when the server has JIT), and
// record every statement it runs, nested ones included, in pg_stat_statements (loaded by pgtest's servers).
func eagerJIT(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx := t.Context()
	var loaded bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT 'pg_stat_statements' = ANY (string_to_array(
		replace(current_setting('shared_preload_libraries'), ' ', ''), ','))`).Scan(&loaded))
	if !loaded {
		if os.Getenv("TEST_DATABASE_URL") != "" {
			t.Skip("the server of TEST_DATABASE_URL does not load pg_stat_statements (shared_preload_libraries)")
		}
		t.Fatal("pgtest's server must load pg_stat_statements")
	}
	_, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public`)
	require.NoError(t, err)
	for _, set := range []string{`SET jit = on`, `SET jit_above_cost = 0`, `SET jit_inline_above_cost = 0`,
		`SET jit_optimize_above_cost = 0`, `SET pg_stat_statements.track = 'all'`} {
		_, err := conn.Exec(ctx, set)
		require.NoError(t, err)
	}
}

// jitCompiled returns the functions JIT-compiled for statements of this database: those nested in a
// top-level statement (what stepready's functions run), and the top-level ones.
func jitCompiled(t *testing.T, conn *pgx.Conn) (nested, topLevel int64, nestedStatements []string) {
	t.Helper()
	require.NoError(t, conn.QueryRow(t.Context(), `
		SELECT COALESCE(sum(jit_functions) FILTER (WHERE NOT toplevel), 0)::bigint,
		       COALESCE(sum(jit_functions) FILTER (WHERE toplevel), 0)::bigint,
		       COALESCE(array_agg(left(query, 200)) FILTER (WHERE NOT toplevel AND jit_functions > 0), '{}')
		  FROM public.pg_stat_statements
		 WHERE dbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())`).
		Scan(&nested, &topLevel, &nestedStatements))
	return nested, topLevel, nestedStatements
}

func testCreationReads(t *testing.T, mode creationStats) {
	db := pgtest.New(t)
	conn := db.Conn(t)
	ctx := t.Context()
	var analyzed bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_user_tables
		WHERE schemaname = 'stepready' AND relname IN ('tasks', 'steps', 'step_edges')
		  AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL))`).Scan(&analyzed))
	require.False(t, analyzed, "the fixture must be a never-analyzed database")
	var counted []string
	require.NoError(t, conn.QueryRow(ctx, `SELECT COALESCE(array_agg(relname::text), '{}') FROM pg_catalog.pg_class
		WHERE relnamespace = 'stepready'::regnamespace AND relname IN ('tasks', 'steps', 'step_edges')
		  AND reltuples >= 0`).Scan(&counted))
	require.Empty(t, counted, "tables whose size the planner was told (never vacuumed or analyzed: reltuples -1)")

	batch := make([]any, 500)
	for i := range batch {
		batch[i] = chainDef("bulk", 4, "")
	}
	fill := func(batches int) {
		t.Helper()
		for range batches {
			_, err := createTasks(t, db.Pool, mustJSON(t, batch))
			require.NoError(t, err)
		}
	}
	switch mode {
	case analyzedEmpty:
		_, err := conn.Exec(ctx, `ANALYZE stepready.tasks, stepready.steps, stepready.step_edges`)
		require.NoError(t, err)
	case analyzedMidLoad:
		eagerJIT(t, conn)
		fill(2)
		_, err := conn.Exec(ctx, `ANALYZE stepready.tasks, stepready.steps, stepready.step_edges`)
		require.NoError(t, err)
	}

	chain := mustJSON(t, chainDef("chain", 4, ""))
	const perRound = 100
	round := func() creationReads {
		t.Helper()
		before := readCreationStats(t, conn)
		for i := range perRound {
			// One statement per task, as a loop of plain SQL (pgbench) sends it.
			_, err := conn.Exec(ctx, `SELECT stepready.create_task('`+chain+`')`, pgx.QueryExecModeSimpleProtocol)
			require.NoError(t, err)
			if i == 0 && mode == analyzedMidLoad {
				// Early, so that a compiling creation path fails here rather than after minutes of compiling.
				nested, _, statements := jitCompiled(t, conn)
				require.Zero(t, nested, "statements of create_task JIT-compiled: %q", statements)
			}
		}
		after := readCreationStats(t, conn)
		return creationReads{after.seq - before.seq, after.idx - before.idx}
	}
	// The plain-SQL path (SPEC §2): a task, its steps and its edges by INSERTs in one transaction; the
	// triggers do the rest.
	// Its own session, so that the triggers' plans are made for plain INSERTs, not inside create_task.
	plainConn := db.Conn(t)
	plainRound := func() creationReads {
		t.Helper()
		before := readCreationStats(t, plainConn)
		for range perRound {
			_, err := plainConn.Exec(ctx, `
				INSERT INTO stepready.tasks (name) VALUES ('plain');
				INSERT INTO stepready.steps (task_id, name, handler)
				SELECT pg_catalog.currval(pg_catalog.pg_get_serial_sequence('stepready.tasks', 'id')), 's' || g, 'noop'
				  FROM pg_catalog.generate_series(1, 4) AS g;
				INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
				SELECT s.last - 4 + g, s.last - 3 + g
				  FROM (SELECT pg_catalog.currval(pg_catalog.pg_get_serial_sequence('stepready.steps', 'id')) AS last) s,
				       pg_catalog.generate_series(1, 3) AS g`, pgx.QueryExecModeSimpleProtocol)
			require.NoError(t, err)
		}
		after := readCreationStats(t, plainConn)
		return creationReads{after.seq - before.seq, after.idx - before.idx}
	}
	small := round()
	smallPlain := plainRound()

	// Thousands more tasks (and their steps and edges), created in bulk on another connection.
	fill(8)
	large := round()
	largePlain := plainRound()
	t.Logf("plain INSERTs per task: %d rows read by index at first, %d later; %d and %d by sequential scans",
		smallPlain.idx/perRound, largePlain.idx/perRound, smallPlain.seq, largePlain.seq)
	if mode != analyzedEmpty {
		// Statistics that say "empty" (an ANALYZE of the empty tables) make PostgreSQL's own foreign-key checks
		// plan sequential scans in a session of plain INSERTs, until autovacuum analyzes the tables again (after
		// 50 rows); create_task is immune (it plans everything it runs with sequential scans off). See
		// docs/functions.md#create_tasks.
		require.Zero(t, smallPlain.seq+largePlain.seq, "rows read by sequential scans defining tasks by plain INSERTs")
		require.LessOrEqual(t, largePlain.idx, smallPlain.idx+smallPlain.idx/10,
			"rows read by index per task by plain INSERTs grew with the table: %d then %d", smallPlain.idx, largePlain.idx)
	}

	t.Logf("per task: %d rows read by index at first, %d with ~4,000 tasks more; %d and %d by sequential scans",
		small.idx/perRound, large.idx/perRound, small.seq, large.seq)
	require.Zero(t, small.seq, "rows read by sequential scans while creating %d tasks", perRound)
	require.Zero(t, large.seq, "rows read by sequential scans while creating %d tasks", perRound)
	require.LessOrEqual(t, large.idx, small.idx+small.idx/10,
		"rows read by index per task grew with the table: %d then %d for %d tasks", small.idx, large.idx, perRound)
	require.Less(t, large.idx/perRound, int64(40), "rows read per 4-step task")

	// The same holds for create_tasks itself.
	before := readCreationStats(t, conn)
	rows, err := conn.Query(ctx, `SELECT count(*) FROM stepready.create_tasks($1::jsonb)`, mustJSON(t, batch[:100]))
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	after := readCreationStats(t, conn)
	require.Zero(t, after.seq-before.seq, "rows read by sequential scans in create_tasks of 100 tasks")
	require.Less(t, (after.idx-before.idx)/100, int64(40), "rows read per task by create_tasks")

	if mode == analyzedMidLoad {
		nested, topLevel, statements := jitCompiled(t, conn)
		var available bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_catalog.pg_jit_available()`).Scan(&available))
		t.Logf("JIT available: %v; functions compiled for top-level statements %d, for nested ones %d",
			available, topLevel, nested)
		if available {
			require.Positive(t, topLevel, "with jit_above_cost = 0 the session's own statements are compiled: "+
				"the test would see a statement of the creation path compiled")
		}
		require.Zero(t, nested, "statements of the creation path JIT-compiled: %q", statements)
	}
}

// TestDefinitionSizeLimit: a definition over stepready.max_definition_bytes (1 MiB by default) is refused naming
// its size, at the limit it is accepted (SPEC §17).
func TestDefinitionSizeLimit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	conn := db.Conn(t)
	// A definition of exactly n bytes as jsonb prints it: padding in the context.
	def := func(n int) string {
		base := `{"name": "big", "steps": [{"name": "s", "handler": "noop"}], "context": {"pad": ""}}`
		return strings.Replace(base, `"pad": ""`, `"pad": "`+strings.Repeat("x", n-len(base))+`"`, 1)
	}
	_, err := conn.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`, def(1048576))
	require.NoError(t, err, "exactly 1 MiB")
	_, err = conn.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`, def(1048577))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
	require.Equal(t, "definition: is 1048577 bytes, over the limit of 1048576 bytes (setting stepready.max_definition_bytes)",
		pgErr.Message)

	_, err = conn.Exec(ctx, `SET stepready.max_definition_bytes = 200`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT * FROM stepready.create_tasks($1::jsonb)`, `[`+def(150)+`, `+def(201)+`]`)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "definitions[1]: definition: is 201 bytes, over the limit of 200 bytes (setting stepready.max_definition_bytes)",
		pgErr.Message)
}
