package integration

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepready/stepready/tests/integration/pgtest"
)

// TestBulkEdgeInsertReadsEdgesByKey: loading many edges with one plain INSERT into an empty step_edges (a fresh
// installation, statistics saying the table is tiny) stays linear. The row trigger's cycle check is planned once,
// for the first row; planned as a sequential scan of the (then empty) table it would scan every edge inserted
// before each row: 3,000 edges would read about 4.5 million rows. Its lookups must go through the edge indexes.
func TestBulkEdgeInsertReadsEdgesByKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	conn := db.Conn(t)
	ctx := t.Context()
	for _, sql := range []string{
		`INSERT INTO stepready.tasks (name) SELECT 'chain' FROM generate_series(1, 1000)`,
		`INSERT INTO stepready.steps (task_id, name, handler) SELECT t.id, 's' || g, 'noop'
			FROM stepready.tasks t, generate_series(1, 4) g`,
		`ANALYZE stepready.step_edges`, // empty: the planner is told so
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	edgesRead := func() int64 {
		t.Helper()
		_, err := conn.Exec(ctx, `SELECT pg_catalog.pg_stat_force_next_flush()`)
		require.NoError(t, err)
		var n int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT COALESCE(seq_tup_read, 0) FROM pg_catalog.pg_stat_user_tables
			WHERE schemaname = 'stepready' AND relname = 'step_edges'`).Scan(&n))
		return n
	}
	before := edgesRead()
	tag, err := conn.Exec(ctx, `INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
		SELECT p.id, c.id FROM stepready.steps p
		  JOIN stepready.steps c ON c.task_id = p.task_id AND c.name = 's' || (substr(p.name, 2)::int + 1)`)
	require.NoError(t, err)
	require.Equal(t, int64(3000), tag.RowsAffected())
	require.Less(t, edgesRead()-before, int64(3000), "edges read by sequential scans while inserting 3,000 edges")

	var ready int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM stepready.steps WHERE pending_parents = 0`).Scan(&ready))
	require.Equal(t, 1000, ready, "one root step per chain")
}
