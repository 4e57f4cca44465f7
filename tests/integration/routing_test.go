package integration

// Work routing (SPEC §21): the claim functions' p_queues and p_handlers filters.

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// routingFixture fills a database with claimable steps of two queues ("default", "media") and three handlers
// ("a", "b", "c"), in two task priorities and two step priorities, some keyed (fairness keys k1..k3), some not,
// with due times spread before testBase and a few after it (not due yet).
func routingFixture(b *lifecycleBundle) {
	b.t.Helper()
	b.exec(`INSERT INTO stepready.tasks (name, priority) VALUES ('low', 0), ('high', 5)`)
	b.exec(`INSERT INTO stepready.steps (task_id, name, handler, queue, priority, concurrency_key, concurrency_limit,
	                                     state, attempts, next_attempt_at)
	        SELECT 1 + (g % 2), 's' || g, (ARRAY['a', 'b', 'c'])[1 + g % 3], (ARRAY['default', 'media'])[1 + (g / 3) % 2],
	               (g / 7) % 2,
	               CASE WHEN g % 5 < 3 THEN 'k' || (g % 3) END, CASE WHEN g % 5 < 3 THEN 1000 END,
	               CASE WHEN g % 4 = 0 THEN 'waiting_for_retry' ELSE 'pending' END,
	               CASE WHEN g % 4 = 0 THEN 1 ELSE 0 END,
	               CASE WHEN g % 4 = 0 THEN $1::timestamptz + ((g % 11) - 8) * interval '1 minute' END
	          FROM generate_series(1, 240) g`, testBase)
	// The keys' flow_state rows exist (as after their first claim): a claim creates those of its first batch of keys
	// only, and passes over keys met later without one until its next claim (docs/design-core.md).
	b.exec(`INSERT INTO stepready.flow_state (key) VALUES ('k0'), ('k1'), ('k2')`)
	b.exec(`ANALYZE stepready.steps`)
}

// routedClaim claims with claim_ready_steps(limit, …, p_queues, p_handlers) in a transaction it rolls back, and
// returns the claimed ids in claim order.
func routedClaim(t *testing.T, b *lifecycleBundle, limit int, queues, handlers []string) []int64 {
	t.Helper()
	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	rows, err := tx.Query(b.ctx, `SELECT step_id FROM stepready.claim_ready_steps($1, 'w', 60000, $2, $3, $4)`,
		limit, testBase, queues, handlers)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// expectedClaimOrder is the claim order of the ready steps that match the filters, computed from its definition
// (docs/design-core.md, "Fairness across claims"), for a claim that starts the fairness ring from its beginning,
// meets no limit and takes every matching step: task priority desc, step priority desc, then within a group
// round 1 (the first step of every key in key order, ” first), then what is left of each key in key order, each
// key's steps by due time, then id.
func expectedClaimOrder(t *testing.T, b *lifecycleBundle, queues, handlers []string) []int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT id FROM (
		    SELECT s.id, s.task_priority, s.priority, s.flow_key,
		           COALESCE(s.next_attempt_at, '-infinity'::timestamptz) AS due,
		           row_number() OVER (PARTITION BY s.task_priority, s.priority, s.flow_key
		                              ORDER BY COALESCE(s.next_attempt_at, '-infinity'::timestamptz), s.id) AS rnd
		      FROM stepready.steps s
		     WHERE s.state IN ('pending', 'waiting_for_retry') AND s.pending_parents = 0 AND NOT s.task_held
		       AND COALESCE(s.next_attempt_at, '-infinity'::timestamptz) <= $1
		       AND ($2::text[] IS NULL OR s.queue = ANY ($2))
		       AND ($3::text[] IS NULL OR s.handler = ANY ($3))) x
		 ORDER BY task_priority DESC, priority DESC, rnd > 1, flow_key, due, id`, testBase, queues, handlers)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// The filters' boundaries: NULL is any, an empty array is none, each filter alone and both together, names that
// match nothing, and the claim order among the matching steps is the claim order of the unfiltered claim.
func TestClaimRoutingFilters(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	routingFixture(b)

	all := expectedClaimOrder(t, b, nil, nil)
	require.Greater(t, len(all), 100)
	require.Equal(t, all, routedClaim(t, b, 1000, nil, nil), "the unfiltered claim follows the claim order")

	for _, c := range []struct {
		name             string
		queues, handlers []string
		none             bool
	}{
		{name: "queues only", queues: []string{"media"}},
		{name: "queues only, two", queues: []string{"media", "default"}},
		{name: "handlers only", handlers: []string{"b"}},
		{name: "handlers only, two", handlers: []string{"c", "a"}},
		{name: "both", queues: []string{"media"}, handlers: []string{"a", "c"}},
		{name: "both, every route", queues: []string{"default", "media"}, handlers: []string{"a", "b", "c"}},
		{name: "duplicates", queues: []string{"media", "media"}, handlers: []string{"b", "b"}},
		{name: "unknown queue", queues: []string{"nowhere"}, none: true},
		{name: "unknown handler", handlers: []string{"zzz"}, none: true},
		{name: "unknown beside known", queues: []string{"nowhere", "default"}, handlers: []string{"zzz", "a"}},
		{name: "empty queues", queues: []string{}, none: true},
		{name: "empty handlers", handlers: []string{}, none: true},
		{name: "empty queues, handlers given", queues: []string{}, handlers: []string{"a"}, none: true},
		{name: "queues given, empty handlers", queues: []string{"default"}, handlers: []string{}, none: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := expectedClaimOrder(t, b, c.queues, c.handlers)
			if c.none {
				require.Empty(t, want)
			} else {
				require.NotEmpty(t, want)
				require.Less(t, len(want), len(all)+1)
			}
			require.Equal(t, want, routedClaim(t, b, 1000, c.queues, c.handlers), "all matching steps, in claim order")
			// A claim cut short within round 1 takes the first of them.
			n := min(3, len(want))
			require.Equal(t, want[:n], routedClaim(t, b, 3, c.queues, c.handlers), "the first matching steps")
		})
	}

	t.Run("a NULL element is refused, naming the parameter", func(t *testing.T) {
		for _, c := range []struct {
			queues, handlers []*string
			param            string
		}{
			{queues: []*string{ptr("default"), nil}, param: "p_queues"},
			{handlers: []*string{nil}, param: "p_handlers"},
		} {
			_, err := b.db.Pool.Exec(b.ctx, `SELECT * FROM stepready.claim_ready_steps(1, 'w', 60000, $1, $2, $3)`,
				testBase, c.queues, c.handlers)
			requireSQLState(t, err, "22023")
			require.ErrorContains(t, err, c.param)
			_, err = b.db.Pool.Exec(b.ctx, `SELECT * FROM stepready.claim_and_start_steps(1, 'w', 60000, $1, $2, $3)`,
				testBase, c.queues, c.handlers)
			requireSQLState(t, err, "22023")
			require.ErrorContains(t, err, c.param)
		}
		var n int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx,
			`SELECT count(*) FROM stepready.steps WHERE state NOT IN ('pending', 'waiting_for_retry')`).Scan(&n))
		require.Zero(t, n, "nothing claimed")
	})

	t.Run("claim_and_start_steps takes the same filters", func(t *testing.T) {
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		rows, err := tx.Query(b.ctx, `SELECT step_id FROM stepready.claim_and_start_steps(1000, 'w', 60000, $1, $2, $3)`,
			testBase, []string{"media"}, []string{"b"})
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Equal(t, expectedClaimOrder(t, b, []string{"media"}, []string{"b"}), ids)
		// Named arguments, as a foreign worker may write them.
		var n int
		require.NoError(t, tx.QueryRow(b.ctx, `SELECT count(*) FROM stepready.claim_and_start_steps(1000, 'w', 60000,
			p_as_of => $1, p_handlers => ARRAY['a'])`, testBase).Scan(&n))
		require.Equal(t, len(expectedClaimOrder(t, b, nil, []string{"a"})), n)
	})
}

// Concurrent filtered claimers of overlapping routes take disjoint sets, and together every matching step.
func TestClaimRoutingConcurrentClaimersDisjoint(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	routingFixture(b)
	want := expectedClaimOrder(t, b, []string{"default", "media"}, []string{"a", "b"})

	filters := [][2][]string{{nil, {"a", "b"}}, {{"default", "media"}, {"b", "a"}}, {{"media"}, nil}, {nil, {"a"}}}
	seen := map[int64]int{}
	for round := 0; round < 50; round++ {
		results := make(chan []int64, len(filters))
		for _, f := range filters {
			go func() {
				rows, err := b.db.Pool.Query(b.ctx,
					`SELECT step_id FROM stepready.claim_ready_steps(3, 'w', 60000, $1, $2, $3)`, testBase, f[0], f[1])
				if err != nil {
					results <- nil
					return
				}
				ids, _ := pgx.CollectRows(rows, pgx.RowTo[int64])
				results <- ids
			}()
		}
		for range filters {
			for _, id := range <-results {
				seen[id]++
			}
		}
	}
	for id, n := range seen {
		require.Equal(t, 1, n, "step %d claimed %d times", id, n)
	}
	for _, id := range want {
		require.Contains(t, seen, id, "a matching step was never claimed")
	}
}

// A filtered claim keeps the keys' limits and fairness: a key's concurrency limit counts its steps in flight
// whoever claimed them, and the round-robin goes across the keys that have matching steps.
func TestClaimRoutingKeepsFlowLimitsAndFairness(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	b.exec(`INSERT INTO stepready.tasks (name) VALUES ('t')`)
	// Keys k0..k3, limit 2 each; on every key handler "a" and handler "b" steps.
	b.exec(`INSERT INTO stepready.steps (task_id, name, handler, concurrency_key, concurrency_limit)
	        SELECT 1, 's' || g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 'k' || (g / 2 % 4), 2
	          FROM generate_series(0, 79) g`)
	// A claimer of "b" takes one step of each key first.
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM stepready.claim_ready_steps(4, 'wb', 60000, $1,
		NULL, ARRAY['b'])`, testBase).Scan(&n))
	require.Equal(t, 4, n)
	// A claimer of "a" gets one more per key (the limit of 2 counts the "b" step in flight), round-robin.
	rows, err := b.db.Pool.Query(b.ctx, `SELECT c.step_id, s.concurrency_key, s.handler
		FROM stepready.claim_ready_steps(100, 'wa', 60000, $1, NULL, ARRAY['a']) c
		JOIN stepready.steps s ON s.id = c.step_id`, testBase)
	require.NoError(t, err)
	type got struct {
		ID      int64
		Key     string
		Handler string
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[got])
	require.NoError(t, err)
	require.Len(t, claimed, 4, "each key's limit counts the other claimer's steps")
	keys := map[string]bool{}
	for _, c := range claimed {
		require.Equal(t, "a", c.Handler)
		keys[c.Key] = true
	}
	require.Len(t, keys, 4, "one step of every key: round-robin across keys")
	var inFlight []int
	rows, err = b.db.Pool.Query(b.ctx, `SELECT count(*)::int FROM stepready.steps WHERE state = 'enqueued'
		GROUP BY concurrency_key`)
	require.NoError(t, err)
	inFlight, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{2, 2, 2, 2}, inFlight)
}

// The cost of a filtered claim follows the ready steps that match it (SPEC §21): a claim of 100 steps of one
// handler reads the same number of steps rows with 200,000 ready steps of other handlers in the table as with
// 10,000, and about what it takes. The others are steps of other handlers in the same queue and in another queue,
// keyed and not, in the same priorities as the claimed ones. (Benchmark scenario 12a times the same claim behind
// 1,000,000; loading that many rows here would add two minutes to the suite.)
func TestClaimRoutingCostFollowsMatchingSteps(t *testing.T) {
	t.Parallel()
	read := func(others int) int64 {
		b := lifecycleSetup(t)
		b.exec(`INSERT INTO stepready.tasks (name) VALUES ('t')`)
		started := time.Now()
		b.exec(`INSERT INTO stepready.steps (task_id, name, handler, queue, concurrency_key, concurrency_limit)
		        SELECT 1, 'o' || g, 'other' || (g % 5), (ARRAY['default', 'media'])[1 + g % 2],
		               CASE WHEN g % 3 = 0 THEN 'k' || (g % 50) END, CASE WHEN g % 3 = 0 THEN 1000000 END
		          FROM generate_series(1, $1) g`, others)
		// Each of its own task: the claim's update of a task (pending to in_progress) reads that task's steps.
		b.exec(`WITH t AS (INSERT INTO stepready.tasks (name) SELECT 'mine' FROM generate_series(1, 200) RETURNING id)
		        INSERT INTO stepready.steps (task_id, name, handler) SELECT t.id, 'm', 'mine' FROM t`)
		b.exec(`VACUUM ANALYZE stepready.steps`)
		t.Logf("%d other steps loaded in %s", others, time.Since(started))
		conn := b.db.Conn(t)
		var total int64
		// Both filters, then the handler alone (each claims 100 of the 200).
		for _, claim := range []string{
			`SELECT count(*) FROM stepready.claim_ready_steps(100, 'w', 60000, $1, ARRAY['default'], ARRAY['mine'])`,
			`SELECT count(*) FROM stepready.claim_ready_steps(100, 'w', 60000, $1, NULL, ARRAY['mine'])`,
		} {
			// Once to plan the statements.
			_, err := conn.Exec(b.ctx, `BEGIN`)
			require.NoError(t, err)
			_, err = conn.Exec(b.ctx, claim, testBase)
			require.NoError(t, err)
			_, err = conn.Exec(b.ctx, `ROLLBACK`)
			require.NoError(t, err)
			// Counted by this session's own counters (pg_stat_get_xact_*: what it read and has not reported yet, so no
			// other session's reads, reported late, count in), before and after the claim.
			const readSQL = `SELECT pg_catalog.pg_stat_get_xact_tuples_returned('stepready.steps'::regclass)
				       + (SELECT COALESCE(sum(pg_catalog.pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)
				            FROM pg_catalog.pg_index i WHERE i.indrelid = 'stepready.steps'::regclass)`
			tx, err := conn.Begin(b.ctx)
			require.NoError(t, err)
			var before, after int64
			require.NoError(t, tx.QueryRow(b.ctx, readSQL).Scan(&before))
			begin := time.Now()
			var n int
			require.NoError(t, tx.QueryRow(b.ctx, claim, testBase).Scan(&n))
			took := time.Since(begin)
			require.Equal(t, 100, n)
			require.NoError(t, tx.QueryRow(b.ctx, readSQL).Scan(&after))
			tuples := after - before
			require.NoError(t, tx.Rollback(b.ctx))
			t.Logf("%s behind %d other ready steps: %d tuples of steps read, %s", claim, others, tuples, took)
			require.LessOrEqual(t, tuples, int64(2*100+50), "the claim read far more than it took")
			total += tuples
		}
		return total
	}
	small := read(10_000)
	large := read(200_000)
	require.LessOrEqual(t, large, small+20, "the claims read more as other handlers' steps grew")
}

// A step no claimer can take stays ready and says so (SPEC §21): claims of other queues and handlers leave it
// pending, queue_stats shows its age as its queue's oldest ready age, and explain names the queue and handler it
// waits for.
func TestClaimRoutingUnclaimedStepStaysReadyAndVisible(t *testing.T) {
	t.Parallel()
	b := lifecycleSetup(t)
	_, ids := b.task(`{"name": "t", "steps": [{"name": "cut", "handler": "transcode", "queue": "media"}]}`)
	step := ids["cut"]
	var created time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT created_at FROM stepready.steps WHERE id = $1`, step).
		Scan(&created))
	later := created.Add(90 * time.Second)
	for _, f := range [][2][]string{{{"default"}, nil}, {nil, {"noop", "sleep"}}, {{"media"}, {"noop"}},
		{{"default", "media"}, {"resize"}}} {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx,
			`SELECT count(*) FROM stepready.claim_and_start_steps(10, 'w', 60000, $1, $2, $3)`, later, f[0], f[1]).
			Scan(&n))
		require.Zero(t, n, "queues %v, handlers %v", f[0], f[1])
	}
	b.requireState(step, "pending")

	var queue string
	var ready int64
	var oldest float64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT queue, ready, oldest_ready_seconds FROM stepready.queue_stats($1)`, later).Scan(&queue, &ready, &oldest))
	require.Equal(t, "media", queue)
	require.Equal(t, int64(1), ready)
	require.InDelta(t, 90, oldest, 1, "the oldest ready age is the step's wait")

	var reason, message string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT reason, message FROM stepready.explain_step($1, $2)`, step, later).Scan(&reason, &message))
	require.Equal(t, "waiting_for_worker", reason)
	require.Equal(t, "ready: waits for a worker that takes queue media and has handler transcode", message)

	// A claimer that takes it does.
	var got int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT step_id FROM stepready.claim_and_start_steps(10, 'w', 60000,
		$1, ARRAY['media'], ARRAY['transcode'])`, later).Scan(&got))
	require.Equal(t, step, got)
}
