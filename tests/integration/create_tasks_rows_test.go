package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// plainInsert defines a task the plain-SQL way of SPEC §2, with the definition's raw fields (the policy columns
// left to the steps insert trigger, the edges to the edge triggers), in tx; it returns the task's id.
func plainInsert(t *testing.T, tx pgx.Tx, def string) int64 {
	t.Helper()
	ctx := t.Context()
	var id int64
	require.NoError(t, tx.QueryRow(ctx, `
		INSERT INTO stepready.tasks (name, namespace, context, priority, retry, run_at)
		SELECT d ->> 'name', COALESCE(d ->> 'namespace', 'default'), COALESCE(d -> 'context', '{}'),
		       COALESCE((d ->> 'priority')::int, 0), d -> 'retry', (d ->> 'run_at')::timestamptz
		  FROM (SELECT $1::jsonb AS d) x
		RETURNING id`, def).Scan(&id))
	_, err := tx.Exec(ctx, `
		INSERT INTO stepready.steps (task_id, name, handler, input, max_attempts, retryable, backoff, base_delay_ms,
		                             multiplier, max_delay_ms, jitter, retry_policy, timeout_ms, on_exhausted, rules,
		                             max_iterations, collect, queue, priority, breaker_limit, concurrency_key,
		                             concurrency_limit, rate_key, rate_limit, rate_period_ms)
		SELECT $2, st ->> 'name', st ->> 'handler', NULLIF(st -> 'input', 'null'), (st -> 'retry' ->> 'max_attempts')::int,
		       (st -> 'retry' ->> 'retryable')::bool, st -> 'retry' ->> 'backoff',
		       (st -> 'retry' ->> 'base_delay_ms')::bigint, (st -> 'retry' ->> 'multiplier')::float8,
		       (st -> 'retry' ->> 'max_delay_ms')::bigint, (st -> 'retry' ->> 'jitter')::float8,
		       st -> 'retry' ->> 'policy', (st ->> 'timeout_ms')::bigint, st ->> 'on_exhausted', st -> 'rules',
		       (st ->> 'max_iterations')::int, st ->> 'collect', st ->> 'queue', (st ->> 'priority')::int,
		       (st ->> 'breaker_limit')::int, c ->> 'key', (c ->> 'limit')::int, r ->> 'key', (r ->> 'limit')::int,
		       (r ->> 'period_ms')::bigint
		  FROM jsonb_array_elements($1::jsonb -> 'steps') WITH ORDINALITY AS e(st, o),
		       LATERAL (SELECT COALESCE(st -> 'concurrency', $1::jsonb -> 'concurrency') AS c,
		                       COALESCE(st -> 'rate_limit', $1::jsonb -> 'rate_limit') AS r) f
		 ORDER BY o`, def, id)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `
		INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
		SELECT p.id, c.id
		  FROM jsonb_array_elements($1::jsonb -> 'steps') AS e(st)
		 CROSS JOIN LATERAL jsonb_array_elements_text(COALESCE(st -> 'depends_on', '[]')) AS dep(name)
		  JOIN stepready.steps c ON c.task_id = $2 AND c.name = st ->> 'name'
		  JOIN stepready.steps p ON p.task_id = $2 AND p.name = dep.name`, def, id)
	require.NoError(t, err)
	return id
}

// taskRows renders a task, its steps and its edges as text without ids and timestamps (those of creation), in
// step definition order, for comparison.
func taskRows(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, taskID int64) string {
	t.Helper()
	var out string
	require.NoError(t, db.QueryRow(t.Context(), `
		SELECT (SELECT to_jsonb(x) - 'id' - 'created_at' - 'updated_at' FROM stepready.tasks x WHERE x.id = $1)::text
		       || E'\n' || (SELECT string_agg((to_jsonb(s) - 'id' - 'task_id' - 'created_at' - 'updated_at')::text,
		                                      E'\n' ORDER BY s.id)
		                      FROM stepready.steps s WHERE s.task_id = $1)
		       || E'\n' || COALESCE((SELECT string_agg(p.name || ' -> ' || c.name, ', ' ORDER BY p.name, c.name)
		                               FROM stepready.step_edges e
		                               JOIN stepready.steps p ON p.id = e.parent_step_id
		                               JOIN stepready.steps c ON c.id = e.child_step_id
		                              WHERE c.task_id = $1), '')`, taskID).Scan(&out))
	return out
}

// TestCreateTasksWritesWhatThePlainPathWrites: create_tasks writes its rows complete, without the triggers of the
// plain-SQL path (sql/018_validated_write.sql); every column of the task, its steps and its edges must be what
// those triggers make of the same definition inserted by plain SQL: policies resolved through every level of
// SPEC §3 (step field, step preset, task field, task preset, standard), flow control with placeholders, run_at,
// pending parents, counters, defaults.
func TestCreateTasksWritesWhatThePlainPathWrites(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	defs := []map[string]any{
		chainDef("chain", 4, ""),
		{"name": "diamond", "steps": []any{
			map[string]any{"name": "d", "handler": "noop", "depends_on": []string{"b", "c"}},
			map[string]any{"name": "b", "handler": "noop", "depends_on": []string{"a"}},
			map[string]any{"name": "c", "handler": "noop", "depends_on": []string{"a"}},
			map[string]any{"name": "a", "handler": "noop"},
		}},
		{"name": "policies", "namespace": "ns", "priority": 7, "context": map[string]any{"tenant": "acme", "n": 3},
			"retry":       map[string]any{"policy": "patient", "max_attempts": 6, "jitter": 0.25},
			"concurrency": map[string]any{"key": "tenant-${context.tenant}", "limit": 2},
			"rate_limit":  map[string]any{"key": "api", "limit": 10, "period_ms": 1000},
			"steps": []any{
				map[string]any{"name": "own", "handler": "http", "input": map[string]any{"url": "u", "id": 42},
					"retry":      map[string]any{"policy": "aggressive", "backoff": "linear", "max_delay_ms": 5000},
					"timeout_ms": 1500, "on_exhausted": "skip", "max_iterations": 5, "collect": "append",
					"queue": "slow", "priority": -2, "breaker_limit": 0,
					"rules":       []any{map[string]any{"when": "true", "then": map[string]any{"do": "retry"}}},
					"concurrency": map[string]any{"key": "item-${input.id}-${context.n}", "limit": 1},
					"rate_limit":  map[string]any{"key": "r-${input.url}", "limit": 5, "period_ms": 250}},
				map[string]any{"name": "task-level", "handler": "noop", "depends_on": []string{"own"},
					"retry": map[string]any{"retryable": false}},
				map[string]any{"name": "none-preset", "handler": "noop", "depends_on": []string{"own", "task-level"},
					"retry": map[string]any{"policy": "none"}},
			}},
		{"name": "later", "run_at": "2031-05-06T07:08:09.123456+02:00", "retry": map[string]any{"backoff": "fixed"},
			"steps": []any{map[string]any{"name": "s", "handler": "noop", "input": nil}}},
	}
	for _, def := range defs {
		t.Run(def["name"].(string), func(t *testing.T) {
			body := mustJSON(t, def)
			var created int64
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, body).Scan(&created))
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			plain := plainInsert(t, tx, body)
			require.Equal(t, taskRows(t, tx, plain), taskRows(t, db.Pool, created))
		})
	}
}

// TestValidatedWriteIsOnlyCreateTasks: the triggers of the plain-SQL path skip only rows written by create_tasks
// as its owner. A client that sets stepready.validated_write itself gets no bypass: its INSERTs are still
// validated and counted. And create_tasks refuses to write when its owner is not the one the triggers expect
// (changed without a migration), instead of writing rows the triggers would count again.
func TestValidatedWriteIsOnlyCreateTasks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	client := roleConn(t, db, "stepready_client")

	_, err := client.Exec(ctx, `SET stepready.validated_write = 'on'`)
	require.NoError(t, err)
	var taskID, other int64
	require.NoError(t, client.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`,
		mustJSON(t, chainDef("mine", 2, ""))).Scan(&taskID), "create_tasks works for a client (it runs as its owner)")
	require.NoError(t, client.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`,
		mustJSON(t, chainDef("theirs", 1, ""))).Scan(&other))

	// A plain step with a bad value is still refused by the insert trigger, whatever the setting says.
	_, err = client.Exec(ctx, `INSERT INTO stepready.steps (task_id, name, handler, backoff) VALUES ($1, 'x', 'noop', 'bogus')`,
		taskID)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
	require.Contains(t, pgErr.Message, `unknown backoff strategy "bogus"`)

	// An edge across tasks is still refused by the edge trigger.
	_, err = client.Exec(ctx, `INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
		SELECT p.id, c.id FROM stepready.steps p, stepready.steps c
		 WHERE p.task_id = $1 AND p.name = 's1' AND c.task_id = $2 AND c.name = 's1'`, taskID, other)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23514", pgErr.Code)
	require.Contains(t, pgErr.Message, "both steps must belong to the same task")

	// A plain step that is fine is materialized and counted as ever.
	_, err = client.Exec(ctx, `INSERT INTO stepready.steps (task_id, name, handler) VALUES ($1, 'extra', 'noop')`, taskID)
	require.NoError(t, err)
	var maxAttempts, total int32
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT s.max_attempts, t.steps_total FROM stepready.steps s
		JOIN stepready.tasks t ON t.id = s.task_id WHERE s.task_id = $1 AND s.name = 'extra'`, taskID).
		Scan(&maxAttempts, &total))
	require.Equal(t, []int32{3, 3}, []int32{maxAttempts, total}, "standard preset, and the task counts 3 steps")

	// An owner the triggers do not expect: create_tasks refuses, naming the remedy, and writes nothing.
	_, err = db.Pool.Exec(ctx, `ALTER FUNCTION stepready._create_tasks(jsonb, boolean) OWNER TO stepready_client`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT stepready.create_task($1::jsonb)`, mustJSON(t, chainDef("refused", 1, "")))
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55000", pgErr.Code)
	require.Contains(t, pgErr.Message, "scheduler migrate up")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.tasks WHERE name = 'refused'`).Scan(&n))
	require.Zero(t, n)
}

// TestDeletedStepsTakeTheirEdges: step_edges has no foreign keys (schema version 11); deleting steps deletes their
// edges in both directions and recounts the pending parents of the children that remain, deleting a task takes
// its steps and edges, TRUNCATE of steps empties step_edges, and a plain edge to a step that does not exist is
// refused with the foreign-key SQLSTATE.
func TestDeletedStepsTakeTheirEdges(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	var a, b int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, mustJSON(t, chainDef("a", 3, ""))).Scan(&a))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT stepready.create_task($1::jsonb)`, mustJSON(t, chainDef("b", 3, ""))).Scan(&b))
	edges := func(task int64) int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.step_edges e
			WHERE e.parent_step_id IN (SELECT id FROM stepready.steps WHERE task_id = $1)
			   OR e.child_step_id IN (SELECT id FROM stepready.steps WHERE task_id = $1)`, task).Scan(&n))
		return n
	}
	require.Equal(t, 2, edges(a))

	// The middle step: both its edges go, and s3 (its child) no longer waits for it.
	_, err := db.Pool.Exec(ctx, `DELETE FROM stepready.steps WHERE task_id = $1 AND name = 's2'`, a)
	require.NoError(t, err)
	require.Zero(t, edges(a))
	var pending int32
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pending_parents FROM stepready.steps WHERE task_id = $1 AND name = 's3'`,
		a).Scan(&pending))
	require.Zero(t, pending)

	// A whole task (its steps by ON DELETE CASCADE, their edges by the trigger); the other task keeps its own.
	_, err = db.Pool.Exec(ctx, `DELETE FROM stepready.tasks WHERE id = $1`, a)
	require.NoError(t, err)
	var orphans int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.step_edges e
		WHERE NOT EXISTS (SELECT 1 FROM stepready.steps s WHERE s.id = e.parent_step_id)
		   OR NOT EXISTS (SELECT 1 FROM stepready.steps s WHERE s.id = e.child_step_id)`).Scan(&orphans))
	require.Zero(t, orphans)
	require.Equal(t, 2, edges(b))

	// A plain edge to a step that does not exist.
	_, err = db.Pool.Exec(ctx, `INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
		SELECT id, -1 FROM stepready.steps WHERE task_id = $1 AND name = 's1'`, b)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23503", pgErr.Code)
	require.Contains(t, pgErr.Message, "child step -1 does not exist")

	_, err = db.Pool.Exec(ctx, `TRUNCATE stepready.steps CASCADE`)
	require.NoError(t, err)
	require.Zero(t, edges(b))
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stepready.step_edges`).Scan(&left))
	require.Zero(t, left)
}
