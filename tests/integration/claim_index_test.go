package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// planNode is one node of an EXPLAIN (FORMAT JSON) plan, with the fields used here.
type planNode struct {
	NodeType        string     `json:"Node Type"`
	RelationName    string     `json:"Relation Name"`
	IndexName       string     `json:"Index Name"`
	ActualRows      float64    `json:"Actual Rows"`
	ActualLoops     float64    `json:"Actual Loops"`
	RemovedByFilter float64    `json:"Rows Removed by Filter"`
	RemovedByCheck  float64    `json:"Rows Removed by Index Recheck"`
	SharedHit       float64    `json:"Shared Hit Blocks"`
	SharedRead      float64    `json:"Shared Read Blocks"`
	Plans           []planNode `json:"Plans"`
}

// String renders the plan compactly: node type, index and relation, actual rows × loops and filtered rows.
func (n planNode) String() string {
	var sb strings.Builder
	sb.WriteString(n.NodeType)
	if n.IndexName != "" {
		sb.WriteString(" using " + n.IndexName)
	}
	if n.RelationName != "" {
		sb.WriteString(" on " + n.RelationName)
	}
	if n.ActualLoops > 0 {
		fmt.Fprintf(&sb, " (rows=%.0f loops=%.0f", n.ActualRows, n.ActualLoops)
		if n.RemovedByFilter > 0 {
			fmt.Fprintf(&sb, " removed by filter=%.0f", n.RemovedByFilter)
		}
		sb.WriteString(")")
	}
	if len(n.Plans) > 0 {
		parts := make([]string, len(n.Plans))
		for i, c := range n.Plans {
			parts[i] = c.String()
		}
		sb.WriteString(" -> [" + strings.Join(parts, ", ") + "]")
	}
	return sb.String()
}

func (n planNode) walk(visit func(planNode)) {
	visit(n)
	for _, c := range n.Plans {
		c.walk(visit)
	}
}

// explainPlan runs EXPLAIN with the given options and returns the root plan node and a one-line rendering of it.
func explainPlan(t *testing.T, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, options, query string) (planNode, string) {
	t.Helper()
	var raw []byte
	require.NoError(t, q.QueryRow(t.Context(), "EXPLAIN ("+options+", FORMAT JSON) "+query).Scan(&raw))
	var doc []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc), string(raw))
	require.Len(t, doc, 1)
	return doc[0].Plan, doc[0].Plan.String()
}

// stepsTuplesRead is every tuple read from stepready.steps so far, as the cumulative statistics count them:
// sequential-scan tuples plus index entries read through every index of the table.
func stepsTuplesRead(t *testing.T, conn *pgx.Conn) int64 {
	t.Helper()
	// Flush this backend's pending counters; the flush happens when the backend goes idle after this command.
	_, err := conn.Exec(t.Context(), `SELECT pg_catalog.pg_stat_force_next_flush()`)
	require.NoError(t, err)
	var n int64
	require.NoError(t, conn.QueryRow(t.Context(), `
		SELECT COALESCE(tab.seq_tup_read, 0)
		       + (SELECT COALESCE(sum(i.idx_tup_read), 0) FROM pg_catalog.pg_stat_user_indexes i
		           WHERE i.relid = tab.relid)
		  FROM pg_catalog.pg_stat_user_tables tab
		 WHERE tab.schemaname = 'stepready' AND tab.relname = 'steps'`).Scan(&n))
	return n
}

// claimCandidatesQuery returns the candidate query of stepready._claim_pick_rows (the picking half of
// claim_ready_steps and claim_and_start_steps) as installed in the database (read from pg_proc, so that it never
// drifts from sql/060_claim.sql): the parenthesized SELECT that locks the candidate steps of one (task priority,
// step priority) group FOR UPDATE … SKIP LOCKED, with p_as_of, the group (priorities 0, those of the fixture)
// and the remaining limit replaced by literals.
func claimCandidatesQuery(t *testing.T, conn *pgx.Conn, asOf time.Time, limit int) string {
	t.Helper()
	var src string
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT prosrc FROM pg_catalog.pg_proc
		WHERE oid = 'stepready._claim_pick_rows(int, timestamptz, text[], text[])'::regprocedure`).Scan(&src))
	lines := strings.Split(src, "\n")
	for i, line := range lines {
		if k := strings.Index(line, "--"); k >= 0 {
			lines[i] = line[:k]
		}
	}
	body := strings.Join(lines, "\n")
	lock := strings.Index(body, "SKIP LOCKED")
	require.GreaterOrEqual(t, lock, 0, "claim_ready_steps locks no candidates with SKIP LOCKED: update this test")

	// The enclosing parentheses of the locking SELECT (a subquery or a CTE body). No literal of that query holds
	// a parenthesis.
	start, end := -1, -1
	for i, depth := lock-1, 0; i >= 0 && start < 0; i-- {
		switch body[i] {
		case ')':
			depth++
		case '(':
			if depth == 0 {
				start = i + 1
			}
			depth--
		}
	}
	for i, depth := lock, 0; i < len(body) && end < 0; i++ {
		switch body[i] {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				end = i
			}
			depth--
		}
	}
	require.True(t, start >= 0 && end > start, "the locking SELECT of claim_ready_steps is not parenthesized: update this test")
	query := body[start:end]
	require.Contains(t, query, "SELECT")
	query = regexp.MustCompile(`\bp_as_of\b`).ReplaceAllString(query,
		"'"+asOf.UTC().Format(time.RFC3339Nano)+"'::timestamptz")
	query = regexp.MustCompile(`\bp_limit - cardinality\(p_ids\)`).ReplaceAllString(query, strconv.Itoa(limit))
	query = regexp.MustCompile(`\bv_tp\b|\bv_p\b`).ReplaceAllString(query, "0")
	require.NotRegexp(t, `\b[pv]_[a-z_]+\b`, query, "the candidate query uses another variable: update this test")
	return query
}

// claimFixture is the shape of a database for the claim-cost test. Every shape holds exactly `ready` ready
// steps: one root step of each of `ready` small tasks made with create_task.
type claimFixture struct {
	name                       string
	doneTasks, doneSteps       int // finished tasks and the complete steps of each
	blockedTasks, blockedSteps int // tasks whose steps all wait behind one gate step that is still running
	laterSteps                 int // steps waiting for a retry an hour from now: in the index, not due
	ready                      int
}

// TestClaimCostFollowsReadySteps proves that claiming reads the ready steps, not the tables (SPEC §6: "Its cost
// must grow with the number of ready steps, not with the size of the tables"): with thousands of finished
// steps, thousands of steps behind an unfinished parent and hundreds waiting for a future retry, the claim
// query must be answered from one of the two claim indexes and read about as many rows as there are ready steps.
// (The planner picks steps_claim_order_idx when many rows are due, and here, with few due rows, the due range of
// steps_claimable_idx; either way the steps waiting for a future retry are outside the range read.)
func TestClaimCostFollowsReadySteps(t *testing.T) {
	t.Parallel()

	fixtures := []claimFixture{
		// Many finished tasks beside a few active ones (the steady state of a long-running installation).
		{name: "many finished tasks", doneTasks: 1000, doneSteps: 2, blockedTasks: 3, blockedSteps: 1000,
			laterSteps: 300, ready: 5},
		// Few finished tasks with many steps each.
		{name: "few large finished tasks", doneTasks: 50, doneSteps: 40, blockedTasks: 3, blockedSteps: 1000,
			laterSteps: 300, ready: 5},
	}
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			t.Parallel()
			runClaimCost(t, fx)
		})
	}
}

func runClaimCost(t *testing.T, fx claimFixture) {
	b := schemaSetup(t)
	// One session for everything, so the statistics counters measured below count this session's reads alone.
	conn := b.db.Conn(t)
	ctx := t.Context()
	asOf := testBase
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}

	started := time.Now()
	exec(`WITH t AS (INSERT INTO stepready.tasks (name) SELECT 'done' FROM generate_series(1, $1) RETURNING id)
	      INSERT INTO stepready.steps (task_id, name, handler, state, attempts)
	      SELECT t.id, 'c' || g, 'noop', 'complete', 1 FROM t, generate_series(1, $2) g`, fx.doneTasks, fx.doneSteps)
	exec(`WITH t AS (INSERT INTO stepready.tasks (name) SELECT 'blocked' FROM generate_series(1, $1) RETURNING id)
	      INSERT INTO stepready.steps (task_id, name, handler)
	      SELECT t.id, 'b' || g, 'noop' FROM t, generate_series(0, $2) g`, fx.blockedTasks, fx.blockedSteps)
	exec(`INSERT INTO stepready.step_edges (parent_step_id, child_step_id)
	      SELECT gate.id, c.id
	        FROM stepready.tasks t
	        JOIN stepready.steps gate ON gate.task_id = t.id AND gate.name = 'b0'
	        JOIN stepready.steps c ON c.task_id = t.id AND c.name <> 'b0'
	       WHERE t.name = 'blocked'`)
	exec(`UPDATE stepready.steps SET state = 'in_progress', attempts = 1, lease_owner = 'w', lease_expires_at = $1
	       WHERE name = 'b0'`, asOf.Add(time.Hour))
	exec(`WITH t AS (INSERT INTO stepready.tasks (name) VALUES ('later') RETURNING id)
	      INSERT INTO stepready.steps (task_id, name, handler, state, attempts, next_attempt_at)
	      SELECT t.id, 'l' || g, 'noop', 'waiting_for_retry', 1, $2 FROM t, generate_series(1, $1) g`,
		fx.laterSteps, asOf.Add(time.Hour))
	for i := range fx.ready {
		exec(`SELECT stepready.create_task($1::jsonb)`, fmt.Sprintf(`{"name": "ready%d", "steps": [
			{"name": "a", "handler": "noop"}, {"name": "b", "handler": "noop", "depends_on": ["a"]}]}`, i))
	}
	exec(`VACUUM (ANALYZE) stepready.steps, stepready.tasks, stepready.step_edges`)
	t.Logf("fixture loaded in %s", time.Since(started))

	var total, ready, unsatisfied int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM stepready.steps`).Scan(&total))
	require.Equal(t, int64(fx.doneTasks*fx.doneSteps+fx.blockedTasks*(fx.blockedSteps+1)+fx.laterSteps+2*fx.ready),
		total)
	require.NoError(t, conn.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE ready)
		  FROM stepready.step_readiness(ARRAY(SELECT id FROM stepready.tasks), NULL, $1)`, asOf).Scan(&ready))
	require.Equal(t, int64(fx.ready), ready, "the fixture has exactly the intended ready steps")
	require.NoError(t, conn.QueryRow(ctx,
		`SELECT count(*) FROM stepready.steps WHERE pending_parents > 0`).Scan(&unsatisfied))
	require.Equal(t, int64(fx.blockedTasks*fx.blockedSteps+fx.ready), unsatisfied)

	query := claimCandidatesQuery(t, conn, asOf, 100)
	limit := float64(2*fx.ready + 10) // rows a claim of fx.ready steps may read

	// The three checks run in order on the one session (a pgx.Conn is not safe for concurrent use), so these
	// subtests are deliberately not parallel.
	claimIndex := func(name string) bool { return name == "steps_claim_order_idx" || name == "steps_claimable_idx" }
	t.Run("the plan reads a claim index", func(t *testing.T) {
		plan, raw := explainPlan(t, conn, "COSTS OFF", query)
		usesIndex := false
		plan.walk(func(n planNode) {
			if claimIndex(n.IndexName) {
				usesIndex = true
			}
			require.False(t, n.RelationName == "steps" && n.NodeType == "Seq Scan", "sequential scan of steps: %s", raw)
		})
		require.True(t, usesIndex, "the claim query uses no claim index: %s", raw)
	})

	t.Run("the plan reads about as many rows as are ready", func(t *testing.T) {
		tx, err := conn.Begin(ctx) // EXPLAIN ANALYZE takes the row locks: roll them back
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		plan, raw := explainPlan(t, tx, "ANALYZE, BUFFERS", query)

		var fromIndex, fromSteps float64
		plan.walk(func(n planNode) {
			loops := max(n.ActualLoops, 1)
			if claimIndex(n.IndexName) {
				fromIndex += n.ActualRows * loops
			}
			if n.RelationName == "steps" {
				fromSteps += (n.ActualRows + n.RemovedByFilter + n.RemovedByCheck) * loops
			}
		})
		t.Logf("rows from the claim index: %.0f, rows read from steps: %.0f (of %d), buffers: %.0f; plan: %s",
			fromIndex, fromSteps, total, plan.SharedHit+plan.SharedRead, raw)
		require.Equal(t, float64(fx.ready), plan.ActualRows, "the query returns the ready steps")
		require.LessOrEqual(t, fromSteps, limit, "rows of steps read by the claim query (%d in the table): %s",
			total, raw)
		require.GreaterOrEqual(t, fromIndex, float64(fx.ready), "entries read from the claim index: %s", raw)
		require.LessOrEqual(t, fromIndex, limit, "entries read from the claim index: %s", raw)
	})

	t.Run("claim_ready_steps reads about as many rows as are ready", func(t *testing.T) {
		before := stepsTuplesRead(t, conn)
		var claimed int64
		require.NoError(t, conn.QueryRow(ctx,
			`SELECT count(*) FROM stepready.claim_ready_steps(100, 'w', 60000, $1)`, asOf).Scan(&claimed))
		read := stepsTuplesRead(t, conn) - before
		t.Logf("claim_ready_steps read %d tuples of steps (of %d) to claim %d", read, total, claimed)
		require.Equal(t, int64(fx.ready), claimed)
		require.GreaterOrEqual(t, read, claimed, "the statistics saw the claim")
		require.LessOrEqual(t, read, int64(10*fx.ready+50), "tuples of steps read by one claim (%d in the table)",
			total)
	})
}
